// The synthetic generator (mooncake_gym/model/workload.py synthetic_trace) in C++ but for its draws:
// the trace's assembly from numpy's draws (SyntheticAssembly: the same float operations in the same
// order as the numpy reference _assemble_reference) and its block ids (synthetic_block_ids: integer
// arithmetic only). tests/test_engine_envs.py compares both with the numpy reference. The draws
// stay numpy's, in Python, in the generator's order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace mooncake {

// Request r's blocks j < ceil(total[r] / block_tokens): block j of the system prompt prompt[r] while
// j < min(its length, full_shared[r]) (shared by every session with that prompt), else block j of
// session[r]'s shared stream while j < full_shared[r], else the request's own. Ids are numbered in
// order of first appearance (request by request, block by block), as _block_ids_reference renumbers them.
// Writes starts (n + 1 offsets) and ids (starts[n] of them).
inline void synthetic_block_ids(size_t n, const int64_t* total, const int64_t* full_shared, const int64_t* prompt_blocks,
                                size_t n_prompts, const int64_t* prompt, const int64_t* session, int64_t block_tokens,
                                std::vector<int64_t>& starts, std::vector<int64_t>& ids) {
    if (block_tokens < 1) throw std::invalid_argument("block_tokens: expected >= 1");
    starts.assign(n + 1, 0);
    int64_t max_session = 0;
    for (size_t r = 0; r < n; ++r) {
        if (total[r] < 0 || session[r] < 0 || prompt[r] < 0 || static_cast<size_t>(prompt[r]) >= n_prompts)
            throw std::invalid_argument("synthetic_block_ids: a request's tokens, session or prompt out of range");
        starts[r + 1] = starts[r] + (total[r] + block_tokens - 1) / block_tokens;
        if (session[r] > max_session) max_session = session[r];
    }
    std::vector<int64_t> prompt_offset(n_prompts + 1, 0);
    for (size_t p = 0; p < n_prompts; ++p) prompt_offset[p + 1] = prompt_offset[p] + prompt_blocks[p];
    // a session's stream is at most its longest request's blocks long
    std::vector<int64_t> width(static_cast<size_t>(max_session) + 1, 0), session_offset(static_cast<size_t>(max_session) + 2, 0);
    for (size_t r = 0; r < n; ++r) {
        int64_t& w = width[static_cast<size_t>(session[r])];
        const int64_t m = starts[r + 1] - starts[r];
        if (m > w) w = m;
    }
    for (size_t q = 0; q <= static_cast<size_t>(max_session); ++q) session_offset[q + 1] = session_offset[q] + width[q];
    // the rank given to each shared block (prompt blocks, then the sessions' streams), -1 until seen
    const int64_t n_prompt_ids = prompt_offset[n_prompts];
    std::vector<int64_t> rank(static_cast<size_t>(n_prompt_ids + session_offset.back()), -1);
    ids.resize(static_cast<size_t>(starts[n]));
    int64_t next = 0;
    for (size_t r = 0; r < n; ++r) {
        const int64_t m = starts[r + 1] - starts[r];
        const int64_t p = prompt[r];
        const int64_t shared = full_shared[r];
        const int64_t in_prompt = prompt_blocks[p] < shared ? prompt_blocks[p] : shared;
        int64_t* out = ids.data() + starts[r];
        for (int64_t j = 0; j < m; ++j) {
            int64_t slot;
            if (j < in_prompt) slot = prompt_offset[static_cast<size_t>(p)] + j;
            else if (j < shared) slot = n_prompt_ids + session_offset[static_cast<size_t>(session[r])] + j;
            else {  // the request's own: never seen before
                out[j] = next++;
                continue;
            }
            int64_t& k = rank[static_cast<size_t>(slot)];
            if (k < 0) k = next++;
            out[j] = k;
        }
    }
}

// A token count from a continuous draw (workload.py _lengths): rounded half to even, at least 1.
inline int64_t synthetic_length(double x) {
    const double r = std::nearbyint(x);
    return static_cast<int64_t>(r > 1.0 ? r : 1.0);
}

// The synthetic trace assembled from its session batches' draws (workload.py synthetic_trace after
// _session_batch): add() takes one batch's draws, in numpy's order, and its sessions' starts;
// arrivals_before() is the loop's stopping rule; build() makes the trace's columns.
class SyntheticAssembly {
  public:
    // the generator's knobs (SyntheticConfig), the system prompts' popularity CDF and lengths (blocks)
    SyntheticAssembly(double document_share, int64_t output_max, int64_t input_max, int64_t block_tokens,
                      std::vector<double> cdf, std::vector<int64_t> prompt_blocks)
        : share_(document_share), output_max_(output_max), input_max_(input_max), block_tokens_(block_tokens),
          cdf_(std::move(cdf)), prompt_blocks_(std::move(prompt_blocks)) {
        if (block_tokens_ < 1) throw std::invalid_argument("block_tokens: expected >= 1");
        if (cdf_.size() != prompt_blocks_.size() || cdf_.empty())
            throw std::invalid_argument("cdf: expected one entry per system prompt");
    }

    // The number of requests of a batch whose document draws are ``doc_u`` and request counts
    // ``questions`` (document sessions) and ``turns`` (chats): what the batch's per-request draws need.
    static int64_t batch_requests(size_t s, const double* doc_u, const int64_t* questions, const int64_t* turns,
                                  double share) {
        int64_t r = 0;
        for (size_t j = 0; j < s; ++j) r += doc_u[j] < share ? questions[j] : turns[j];
        return r;
    }

    // One batch: ``s`` sessions (their starts, prompt and document uniforms, raw document and first
    // chat lengths, question and turn counts) and their ``r`` requests (raw output, question and
    // chat-turn lengths, think times), session by session.
    void add(size_t s, const double* start, const double* prompt_u, const double* doc_u, const double* doc_len,
             const double* chat_len, const int64_t* questions, const int64_t* turns, size_t r, const double* out,
             const double* question, const double* turn, const double* think) {
        if (static_cast<int64_t>(r) != batch_requests(s, doc_u, questions, turns, share_))
            throw std::invalid_argument("add: expected one output, question, turn and think draw per request");
        const size_t first_request = arrival_.size();
        for (auto* v : {&out_, &question_, &turn_, &session_}) v->resize(first_request + r);
        arrival_.resize(first_request + r);
        first_.resize(first_request + r);
        double total = 0.0;  // np.cumsum of the batch's think times (0 at a session's first request)
        size_t q = first_request;
        for (size_t j = 0; j < s; ++j) {
            const bool doc = doc_u[j] < share_;
            // np.searchsorted(cdf, u, side="right"): the entries <= u
            const int64_t prompt = std::upper_bound(cdf_.begin(), cdf_.end(), prompt_u[j]) - cdf_.begin();
            const int64_t n = doc ? questions[j] : turns[j];
            const int64_t session = static_cast<int64_t>(session_prompt_.size());
            session_prompt_.push_back(prompt);
            session_doc_.push_back(doc ? 1 : 0);
            session_opening_.push_back(doc ? synthetic_length(doc_len[j]) : synthetic_length(chat_len[j]));
            double base = 0.0;
            for (int64_t m = 0; m < n; ++m, ++q) {
                const size_t k = q - first_request;
                total += m == 0 ? 0.0 : think[k];
                if (m == 0) base = total - 0.0;
                arrival_[q] = start[j] + (total - base);
                const int64_t o = synthetic_length(out[k]);
                out_[q] = o < output_max_ ? o : output_max_;
                question_[q] = synthetic_length(question[k]);
                turn_[q] = synthetic_length(turn[k]);
                first_[q] = m == 0 ? 1 : 0;
                session_[q] = session;
            }
        }
    }

    // The requests drawn so far arriving before ``t``.
    int64_t arrivals_before(double t) const {
        int64_t c = 0;
        for (double a : arrival_) c += a < t;
        return c;
    }

    // The trace: the requests arriving before ``horizon`` by arrival (ties by session, then as
    // drawn), the first ``n_requests`` (< 0: all): arrival, input tokens, output tokens, session,
    // and the block ids' starts and ids.
    void build(double horizon, int64_t n_requests, std::vector<double>& arrival, std::vector<int64_t>& total,
               std::vector<int64_t>& out, std::vector<int64_t>& session, std::vector<int64_t>& starts,
               std::vector<int64_t>& ids) const {
        const size_t r = arrival_.size();
        // each request's prompt tokens: the session's shared stream (system prompt, then the document
        // or the conversation so far), plus the question (document sessions)
        std::vector<int64_t> shared(r), tokens(r);
        int64_t stream = 0;
        for (size_t i = 0; i < r; ++i) {
            const size_t q = static_cast<size_t>(session_[i]);
            const bool doc = session_doc_[q];
            const int64_t grow = first_[i] ? session_opening_[q] : (doc ? 0 : (i ? out_[i - 1] : 0) + turn_[i]);
            stream = first_[i] ? grow : stream + grow;
            shared[i] = prompt_blocks_[static_cast<size_t>(session_prompt_[q])] * block_tokens_ + stream;
            const int64_t t = shared[i] + (doc ? question_[i] : 0);
            tokens[i] = t < input_max_ ? t : input_max_;
        }
        // np.lexsort((session, arrival)) of the requests before the horizon: by arrival, then session,
        // then as drawn. Sessions are numbered as drawn and their requests added session by session,
        // so (session, index) is index order: a stable sort by arrival (radix_by_arrival) is that order.
        std::vector<size_t> order = radix_by_arrival(horizon);
        size_t n = order.size();
        if (n_requests >= 0 && n > static_cast<size_t>(n_requests)) n = static_cast<size_t>(n_requests);
        arrival.resize(n);
        total.resize(n);
        out.resize(n);
        session.resize(n);
        std::vector<int64_t> full_shared(n), prompt(n);
        for (size_t k = 0; k < n; ++k) {
            const size_t i = order[k];
            arrival[k] = arrival_[i];
            total[k] = tokens[i];
            out[k] = out_[i];
            session[k] = session_[i];
            prompt[k] = session_prompt_[static_cast<size_t>(session_[i])];
            full_shared[k] = (shared[i] < tokens[i] ? shared[i] : tokens[i]) / block_tokens_;
        }
        synthetic_block_ids(n, total.data(), full_shared.data(), prompt_blocks_.data(), prompt_blocks_.size(),
                            prompt.data(), session.data(), block_tokens_, starts, ids);
    }

  private:
    // The indices of the requests arriving before ``horizon``, stably sorted by arrival: an LSD radix
    // sort, a byte at a time, of each arrival's bits made monotone (IEEE 754: a non-negative double's
    // bits order as unsigned integers; a negative one's, inverted, below them; -0.0 is made +0.0, as
    // the comparison has them equal), skipping the bytes every key shares. A comparison sort of the
    // same ~1,500 keys spent most of its time in mispredicted branches.
    std::vector<size_t> radix_by_arrival(double horizon) const {
        struct Item {
            uint64_t key;
            size_t index;
        };
        std::vector<Item> a, b;
        a.reserve(arrival_.size());
        for (size_t i = 0; i < arrival_.size(); ++i)
            if (arrival_[i] < horizon) {
                const double x = arrival_[i] + 0.0;  // -0.0 -> +0.0
                uint64_t bits;
                std::memcpy(&bits, &x, sizeof bits);
                a.push_back(Item{bits >> 63 ? ~bits : bits | (uint64_t(1) << 63), i});
            }
        const size_t n = a.size();
        b.resize(n);
        size_t count[8][256] = {};
        for (const Item& it : a)
            for (int d = 0; d < 8; ++d) ++count[d][(it.key >> (8 * d)) & 0xFF];
        for (int d = 0; d < 8; ++d) {
            const size_t* c = count[d];
            if (n == 0 || c[(a[0].key >> (8 * d)) & 0xFF] == n) continue;  // every key has this byte
            size_t start[256], sum = 0;
            for (int v = 0; v < 256; ++v) {
                start[v] = sum;
                sum += c[v];
            }
            for (const Item& it : a) b[start[(it.key >> (8 * d)) & 0xFF]++] = it;
            a.swap(b);
        }
        std::vector<size_t> order(n);
        for (size_t k = 0; k < n; ++k) order[k] = a[k].index;
        return order;
    }

    double share_;
    int64_t output_max_, input_max_, block_tokens_;
    std::vector<double> cdf_;
    std::vector<int64_t> prompt_blocks_;
    // per session
    std::vector<int64_t> session_prompt_, session_opening_;
    std::vector<uint8_t> session_doc_;
    // per request, as drawn
    std::vector<double> arrival_;
    std::vector<int64_t> out_, question_, turn_, session_;
    std::vector<uint8_t> first_;
};

}  // namespace mooncake
