// The continuous-batching decode instance of mooncake_gym/sim/decode.py (BatchingDecodeInstance) and the
// cluster's default decode rule (fastest_accepting), for cluster.hpp. Between two events the batch is
// constant and iteration k takes alpha + beta k seconds, so the instance jumps from event to event
// (a finish, or its KV running out) in closed form; preemption aborts, or re-queues the request to be
// recomputed or swapped back in. Every formula follows the reference operation for operation, in the
// same order (tests/test_engine_realistic.py compares them after every step).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine.hpp"

namespace mooncake {

// CostModel.decode_step_coefficients(batch) from CostModel.component_coefficients' constants:
// an iteration of `batch` requests holding K tokens of context takes fixed + per_key K seconds.
struct DecodeStep {
    double weights_s = 0, linear_token_s = 0, attention_pair_s = 0, kv_token_s = 0, elementwise_token_s = 0,
           allreduce_fixed_s = 0, allreduce_token_s = 0, overhead_s = 0;

    std::pair<double, double> operator()(int64_t batch) const {
        const double b = static_cast<double>(batch);
        const double linear_s = linear_token_s * b;
        double per_key = 2 * attention_pair_s;
        if (kv_token_s > per_key) per_key = kv_token_s;
        const double fixed = overhead_s + (weights_s > linear_s ? weights_s : linear_s) + per_key * b +
                             elementwise_token_s * b + allreduce_fixed_s + allreduce_token_s * b;
        return {fixed, per_key};
    }
};

enum class Preemption { Abort, Recompute, Swap };

// What the instances of one pool share: the cost model's step, the recompute's prefill time, the swap's
// host link, and the instance's limits.
struct DecodeSpec {
    DecodeStep step;
    PrefillTime recompute;          // CostModel.prefill_time() of the decode instance (dram, overlap)
    int64_t kv_bytes_per_token = 0; // CostModel.load_s(tokens, "dram"): tokens x bytes / the dram tier's rate
    double dram_bandwidth = 1;
    int64_t capacity_tokens = 0, max_running = int64_t(1) << 30;
    double tbt_slo_s = 0.1;         // the instance's check (the SLO less the headroom)
    Preemption preemption = Preemption::Abort;
};

// A request that ended on a decode instance (sim/decode.py Completion); tbt >= 0 where it is known at once.
struct Completion {
    int64_t r;
    double end_s;
    bool preempted;
    double tbt;  // NaN: computed at the end from the token intervals
};

// Python's floor division of integers.
inline int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}

class BatchingDecode {
  public:
    // a finished stint of a request: (request, first boundary, end boundary, first segment, wait before it)
    struct Row {
        int64_t r, j, f, seg0;
        double wait;
    };

    BatchingDecode(int64_t index, const DecodeSpec* spec) : index_(index), spec_(spec) {}

    // -- what a policy sees (sim/decode.py of the same names) --------------------------------------------
    int64_t batch() const { return batch_; }
    int64_t pending_tokens() const { return pending_tokens_; }
    int64_t pending_requests() const { return pending_requests_; }
    bool waiting() const { return !waiting_.empty(); }
    double next_event_s() const { return next_event_s_; }
    int64_t version() const { return version_; }
    double t0() const { return t0_; }
    int64_t it0() const { return it0_; }
    int64_t k_base() const { return k_base_; }
    double busy_s() const { return busy_s_; }
    int64_t preemptions() const { return preemptions_; }
    double preemption_stall_s() const { return preemption_stall_s_; }
    int64_t recomputed_tokens() const { return recomputed_tokens_; }
    const std::vector<Row>& finished() const { return finished_; }

    std::pair<double, double> coefficients(int64_t b) const {
        if (static_cast<size_t>(b) >= co_.size()) {
            const size_t from = co_.size();
            co_.resize(static_cast<size_t>(b) + 1);
            for (size_t k = from; k < co_.size(); ++k) co_[k] = spec_->step(static_cast<int64_t>(k));
        }
        return co_[static_cast<size_t>(b)];
    }

    // Tokens of the batch's contexts at the last iteration boundary at or before `now`.
    int64_t context_tokens(double now) const {
        const int64_t b = batch_;
        if (!b) return 0;
        if (now <= t0_) return k_base_ + b * it0_;
        const auto co = coefficients(b);
        const double h = co.second * static_cast<double>(b) / 2;
        const double first = co.first + co.second * static_cast<double>(k_base_) + 2 * h * static_cast<double>(it0_);
        const double lin = first - h;
        const double dt = now - t0_;
        int64_t n = h > 0 ? static_cast<int64_t>((-lin + std::sqrt(lin * lin + 4 * h * dt)) / (2 * h))
                          : static_cast<int64_t>(dt / first);
        const double dn = static_cast<double>(n);
        if (dn * first + h * dn * static_cast<double>(n - 1) > dt) n -= 1;
        else if (static_cast<double>(n + 1) * first + h * static_cast<double>(n + 1) * dn <= dt) n += 1;
        return k_base_ + b * (it0_ + n);
    }

    int64_t used_tokens(double now) const { return context_tokens(now) + pending_tokens_; }

    double step_s(double now) const {
        if (!batch_) return 0.0;
        const auto co = coefficients(batch_);
        return co.first + co.second * static_cast<double>(context_tokens(now) + pending_tokens_);
    }

    struct Load {
        int64_t batch, used;
        double step, step_with;
    };
    // (batch, used_tokens(now), step_s(now), step_s(now, 1, tokens))
    Load load(double now, int64_t tokens) const {
        const int64_t b = batch_;
        int64_t used;
        if (!b) used = pending_tokens_;
        else if (now <= t0_) used = k_base_ + b * it0_ + pending_tokens_;
        else used = context_tokens(now) + pending_tokens_;
        const auto cw = coefficients(b + 1);
        const double step_with = cw.first + cw.second * static_cast<double>(used + tokens);
        if (!b) return {0, used, 0.0, step_with};
        const auto co = coefficients(b);
        return {b, used, co.first + co.second * static_cast<double>(used), step_with};
    }

    std::optional<double> step_if_accepted(int64_t tokens, double now, bool check_tbt) const {
        if (!waiting_.empty()) return std::nullopt;
        const int64_t context = context_tokens(now) + pending_tokens_ + tokens;
        const int64_t b = batch_ + 1;
        if (context + b > spec_->capacity_tokens || b + pending_requests_ > spec_->max_running) return std::nullopt;
        const auto co = coefficients(b);
        const double step = co.first + co.second * static_cast<double>(context);
        if (check_tbt && step > spec_->tbt_slo_s) return std::nullopt;
        return step;
    }
    bool accepts(int64_t tokens, double now, bool check_tbt) const {
        return step_if_accepted(tokens, now, check_tbt).has_value();
    }

    // -- changes ---------------------------------------------------------------------------------------------
    void reserve(int64_t tokens) {
        pending_tokens_ += tokens;
        pending_requests_ += 1;
    }

    // Request r joins at the first boundary at or after `now`; the requests that ended go to `ended`.
    void join(int64_t r, double now, int64_t tokens, int64_t output_tokens, double first_token_s, int64_t reserved,
              std::vector<Completion>& ended) {
        pending_tokens_ -= reserved;
        if (reserved) pending_requests_ -= 1;
        const double t0 = t0_;
        if (batch_ == 0) {
            if (now > t0) t0_ = now;
        } else if (now > t0) {
            const auto [alpha, beta] = ab();
            int64_t n = iterations_within(now - t0, alpha, beta);
            if (t0 + time_of(n, alpha, beta) < now) n += 1;  // mid-iteration: wait for the boundary
            finish_until(it0_ + n, ended);
        }
        const int64_t k = it0_;
        if (output_tokens <= 1) {  // nothing to decode: the prefill produced its only token
            ended.push_back(Completion{r, t0_, false, 0.0});
            reschedule();
            return;
        }
        add(r, k, tokens, output_tokens - 1, first_token_s);
        if (k_base_ + batch_ * (k + 1) > spec_->capacity_tokens - pending_tokens_) make_room(ended);
        if (!waiting_.empty()) resume(ended);
        reschedule();
    }

    // The event at next_event_s(): finishes at that boundary, then preemptions and resumptions.
    void on_event(std::vector<Completion>& ended) {
        finish_until(next_boundary_, ended);
        if (batch_ && k_base_ + batch_ * (it0_ + 1) > spec_->capacity_tokens - pending_tokens_) make_room(ended);
        if (!waiting_.empty()) resume(ended);
        reschedule();
    }

    // BatchingDecodeInstance.token_intervals of finished[from:]: (requests, offsets, intervals), each row
    // preceded by its request's earlier stints (one request), each stall added to its iteration's interval.
    // (`to`: up to finished()[to - 1] only)
    void token_intervals(size_t from, std::vector<int64_t>& req, std::vector<int64_t>& offsets,
                         std::vector<double>& intervals, size_t to = SIZE_MAX) const {
        req.clear();
        offsets.assign(1, 0);
        static thread_local std::vector<Row> rows_scratch;
        static thread_local std::vector<int64_t> starts_scratch;
        std::vector<Row>& rows = rows_scratch;  // (the thread's buffers looked up once per call)
        std::vector<int64_t>& starts = starts_scratch;  // each row's first interval
        rows.clear();
        starts.clear();
        for (size_t q = from; q < finished_.size() && q < to; ++q) {
            const Row& row = finished_[q];
            if (!stints_.empty()) {
                auto it = stints_.find(row.r);
                if (it != stints_.end()) rows.insert(rows.end(), it->second.begin(), it->second.end());
            }
            rows.push_back(row);
        }
        // each row's intervals: one per iteration of its segments within [j, f) (counted first, then
        // written in place)
        size_t total = 0;
        for (const Row& row : rows) {
            starts.push_back(static_cast<int64_t>(total));
            for (size_t s = static_cast<size_t>(row.seg0); s < segments_.size(); ++s) {
                const Segment& g = segments_[s];
                if (g.a >= row.f) break;
                const int64_t lo = g.a > row.j ? g.a : row.j, hi = g.b < row.f ? g.b : row.f;
                if (hi > lo) total += static_cast<size_t>(hi - lo);
            }
        }
        intervals.resize(total);
        double* out = intervals.data();
        for (size_t q = 0; q < rows.size(); ++q) {
            const Row& row = rows[q];
            double* v = out + starts[q];
            double* w = v;
            for (size_t s = static_cast<size_t>(row.seg0); s < segments_.size(); ++s) {
                const Segment& g = segments_[s];
                if (g.a >= row.f) break;
                const int64_t lo = g.a > row.j ? g.a : row.j, hi = g.b < row.f ? g.b : row.f;
                const double alpha = g.alpha, beta = g.beta;
                for (int64_t k = lo; k < hi; ++k) *w++ = alpha + beta * static_cast<double>(k);
            }
            if (row.f > row.j) v[0] += row.wait;
        }
        if (!stalls_.empty()) {  // each stall added to its iteration's interval, in the order of the stalls
            auto by_k = [](const std::pair<int64_t, double>& x, const std::pair<int64_t, double>& y) {
                return x.first < y.first;
            };
            if (std::is_sorted(stalls_.begin(), stalls_.end(), by_k)) {  // (boundaries only grow: always)
                for (size_t q = 0; q < rows.size(); ++q) {
                    const Row& row = rows[q];
                    auto st = std::lower_bound(stalls_.begin(), stalls_.end(), std::pair<int64_t, double>(row.j, 0.0), by_k);
                    for (; st != stalls_.end() && st->first < row.f; ++st)
                        out[static_cast<size_t>(starts[q] + (st->first - row.j))] += st->second;
                }
            } else {
                for (const auto& [k, seconds] : stalls_)
                    for (size_t q = 0; q < rows.size(); ++q)
                        if (rows[q].j <= k && k < rows[q].f) out[static_cast<size_t>(starts[q] + (k - rows[q].j))] += seconds;
            }
        }
        for (size_t q = 0; q < rows.size(); ++q) {  // a request's stints are consecutive: one request
            if (q > 0 && rows[q].r == rows[q - 1].r) continue;
            req.push_back(rows[q].r);
            if (q > 0) offsets.push_back(starts[q]);
        }
        offsets.push_back(static_cast<int64_t>(intervals.size()));
        if (req.empty()) offsets.assign(1, 0);
    }

    // The slowest token interval of finished()[q] (its first with the wait before it), from its
    // segments, or +inf where a preemption touched it (earlier stints, a stall in its iterations): the
    // v1 environments' quick TBT check (clusterenv.hpp), as BatchingDecodeInstance.tbt_within's bound.
    double slowest_interval(size_t q) const {
        const Row& row = finished_[q];
        const double inf = std::numeric_limits<double>::infinity();
        if (stints_.count(row.r)) return inf;
        for (const auto& st : stalls_)
            if (row.j <= st.first && st.first < row.f) return inf;
        if (row.f <= row.j) return 0.0;
        const Segment& g0 = segments_[static_cast<size_t>(row.seg0)];
        double top = (g0.alpha + g0.beta * static_cast<double>(row.j)) + row.wait;
        for (size_t s = static_cast<size_t>(row.seg0); s < segments_.size(); ++s) {
            const Segment& g = segments_[s];
            if (g.a >= row.f) break;
            const int64_t lo = g.a > row.j ? g.a : row.j, hi = g.b < row.f ? g.b : row.f;
            if (hi <= lo) continue;
            const double x0 = g.alpha + g.beta * static_cast<double>(lo), x1 = g.alpha + g.beta * static_cast<double>(hi - 1);
            if (x0 > top) top = x0;
            if (x1 > top) top = x1;
        }
        return top;
    }

  private:
    struct Member {
        int64_t j, c, f, order;
        double first_token_s, join_wall_s;
        int64_t seg0;
    };
    struct Segment {
        int64_t a, b;
        double alpha, beta;
    };
    struct Finish {
        int64_t f, order, r;
        bool operator>(const Finish& o) const {
            if (f != o.f) return f > o.f;
            if (order != o.order) return order > o.order;
            return r > o.r;
        }
    };
    struct Waiting {
        int64_t r, tokens, iterations;
        double last_s;
    };

    int64_t index_;
    const DecodeSpec* spec_;
    mutable std::vector<std::pair<double, double>> co_;
    double t0_ = 0.0;
    int64_t it0_ = 0, batch_ = 0, k_base_ = 0;
    bool ab_valid_ = false;
    std::pair<double, double> ab_{0.0, 0.0};
    int64_t pending_tokens_ = 0, pending_requests_ = 0;
    std::unordered_map<int64_t, Member> members_;
    std::vector<int64_t> joined_;  // the members in join order (the victim of a preemption: the last)
    std::vector<Finish> finishes_;
    int64_t order_ = 0;
    std::vector<Segment> segments_;
    double next_event_s_ = std::numeric_limits<double>::infinity();
    int64_t next_boundary_ = 0;
    int64_t version_ = 0;
    double busy_s_ = 0.0;
    std::vector<Row> finished_;
    int64_t preemptions_ = 0, recomputed_tokens_ = 0;
    double preemption_stall_s_ = 0.0;
    std::deque<Waiting> waiting_;
    std::unordered_map<int64_t, std::vector<Row>> stints_;
    std::vector<std::pair<int64_t, double>> stalls_;
    int64_t stall_k_ = -1;
    double stall_s_ = 0.0;

    std::pair<double, double> ab() {
        if (!ab_valid_) {
            const auto co = coefficients(batch_);
            ab_ = {co.first + co.second * static_cast<double>(k_base_), co.second * static_cast<double>(batch_)};
            ab_valid_ = true;
        }
        return ab_;
    }

    // the time of iterations it0 .. it0 + n - 1
    double time_of(int64_t n, double alpha, double beta) const {
        const double dn = static_cast<double>(n);
        return dn * (alpha + beta * static_cast<double>(it0_)) + beta * dn * static_cast<double>(n - 1) / 2;
    }

    int64_t iterations_within(double dt, double alpha, double beta) const {
        if (dt <= 0) return 0;
        const double a = alpha + beta * static_cast<double>(it0_) - beta / 2;
        int64_t n = beta > 0 ? static_cast<int64_t>((-a + std::sqrt(a * a + 2 * beta * dt)) / beta)
                             : static_cast<int64_t>(dt / a);
        const double first = alpha + beta * static_cast<double>(it0_);
        while (n > 0 && static_cast<double>(n) * first + beta * static_cast<double>(n) * static_cast<double>(n - 1) / 2 > dt)
            n -= 1;
        while (static_cast<double>(n + 1) * first + beta * static_cast<double>(n + 1) * static_cast<double>(n) / 2 <= dt)
            n += 1;
        return n;
    }

    void advance_to(int64_t k) {
        const int64_t n = k - it0_;
        if (n <= 0) return;
        const auto [alpha, beta] = ab();
        const double dt = time_of(n, alpha, beta);
        segments_.push_back(Segment{it0_, k, alpha, beta});
        t0_ += dt;
        busy_s_ += dt;
        it0_ = k;
    }

    void add(int64_t r, int64_t k, int64_t tokens, int64_t iterations, double first_token_s) {
        const int64_t order = ++order_;
        const int64_t f = k + iterations;
        members_[r] = Member{k, tokens, f, order, first_token_s, wall(), static_cast<int64_t>(segments_.size())};
        joined_.push_back(r);
        finishes_.push_back(Finish{f, order, r});
        std::push_heap(finishes_.begin(), finishes_.end(), std::greater<Finish>());
        batch_ += 1;
        k_base_ += tokens - k;
        ab_valid_ = false;
    }

    double wall() const { return stall_k_ == it0_ ? t0_ - stall_s_ : t0_; }

    void stall(double seconds) {
        if (seconds <= 0.0) return;
        const int64_t k = it0_;
        stalls_.emplace_back(k, seconds);
        if (stall_k_ == k) stall_s_ += seconds;
        else {
            stall_k_ = k;
            stall_s_ = seconds;
        }
        t0_ += seconds;
        busy_s_ += seconds;
        preemption_stall_s_ += seconds;
        version_ += 1;
    }

    double swap_s(int64_t tokens) const {
        if (tokens <= 0) return 0.0;
        return static_cast<double>(tokens * spec_->kv_bytes_per_token) / spec_->dram_bandwidth;
    }

    void resume(std::vector<Completion>& ended) {
        while (!waiting_.empty()) {
            const Waiting w = waiting_.front();
            const int64_t k = it0_;
            if (k_base_ + batch_ * (k + 1) + w.tokens + 1 > spec_->capacity_tokens - pending_tokens_) {
                if (batch_ || pending_tokens_) break;  // waits for room
                waiting_.pop_front();                  // it cannot fit even alone: aborted
                stints_.erase(w.r);
                ended.push_back(Completion{w.r, t0_, true, std::numeric_limits<double>::quiet_NaN()});
                continue;
            }
            waiting_.pop_front();
            double s;
            if (spec_->preemption == Preemption::Swap) s = swap_s(w.tokens);
            else {
                s = spec_->recompute(w.tokens, 0);
                recomputed_tokens_ += w.tokens;
            }
            stall(s);
            add(w.r, k, w.tokens, w.iterations, w.last_s);
        }
    }

    void finish_until(int64_t k, std::vector<Completion>& ended) {
        while (!finishes_.empty() && finishes_.front().f <= k) {
            const Finish x = finishes_.front();
            auto it = members_.find(x.r);
            std::pop_heap(finishes_.begin(), finishes_.end(), std::greater<Finish>());
            finishes_.pop_back();
            if (it == members_.end() || it->second.order != x.order) continue;  // preempted earlier
            advance_to(x.f);
            ended.push_back(leave(x.r, false));
        }
        if (k > it0_) advance_to(k);
    }

    Completion leave(int64_t r, bool preempted) {
        auto it = members_.find(r);
        const Member m = it->second;
        members_.erase(it);
        joined_.erase(std::find(joined_.begin(), joined_.end(), r));
        batch_ -= 1;
        k_base_ -= m.c - m.j;
        if (batch_ == 0) k_base_ = 0;
        ab_valid_ = false;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        if (preempted) return Completion{r, t0_, true, nan};
        finished_.push_back(Row{r, m.j, m.f, m.seg0, m.join_wall_s - m.first_token_s});
        return Completion{r, t0_, false, nan};
    }

    void make_room(std::vector<Completion>& ended) {
        while (batch_ && k_base_ + batch_ * (it0_ + 1) > spec_->capacity_tokens - pending_tokens_) {
            const int64_t r = joined_.back();  // the most recently joined
            if (spec_->preemption == Preemption::Abort) ended.push_back(leave(r, true));
            else requeue(r);
        }
    }

    void requeue(int64_t r) {
        const Member m = members_.at(r);
        const int64_t k = it0_;
        const Row row{r, m.j, k, m.seg0, m.join_wall_s - m.first_token_s};
        leave(r, true);
        std::vector<Row>& stints = stints_[r];
        if (k > m.j) stints.push_back(row);
        const double last_s = k > m.j ? wall() : m.first_token_s;
        const int64_t tokens = m.c + (k - m.j);
        waiting_.push_back(Waiting{r, tokens, m.f - k, last_s});
        preemptions_ += 1;
        if (spec_->preemption == Preemption::Swap) stall(swap_s(tokens));
    }

    void reschedule() {
        version_ += 1;
        const int64_t b = batch_;
        if (!b) {
            next_event_s_ = std::numeric_limits<double>::infinity();
            return;
        }
        while (!finishes_.empty()) {
            const Finish& x = finishes_.front();
            auto it = members_.find(x.r);
            if (it != members_.end() && it->second.order == x.order) break;
            std::pop_heap(finishes_.begin(), finishes_.end(), std::greater<Finish>());
            finishes_.pop_back();
        }
        const int64_t f = finishes_.front().f;
        const int64_t full = floor_div(spec_->capacity_tokens - pending_tokens_ - k_base_, b);
        const int64_t it0 = it0_;
        const int64_t k = f < full ? f : (full > it0 ? full : it0);
        const auto [alpha, beta] = ab();
        next_event_s_ = t0_ + time_of(k - it0, alpha, beta);
        next_boundary_ = k;
    }
};

// sim/decode.py fastest_accepting: the instance with the shortest predicted iteration once a prompt of
// `tokens` joins, among those that accept it at `now` (the first on ties; -1: none). The instances are
// evaluated in order of a lower bound of their step, as the reference does.
inline int64_t fastest_accepting(const std::vector<BatchingDecode>& pool, int64_t tokens, double now, bool check_tbt,
                                 int64_t capacity_tokens, int64_t max_running, double tbt_slo_s) {
    struct Candidate {
        double bound;
        int64_t j;
    };
    static thread_local std::vector<Candidate> candidates;
    candidates.clear();
    bool idle_seen = false;
    for (size_t j = 0; j < pool.size(); ++j) {
        const BatchingDecode& inst = pool[j];
        const int64_t b = inst.batch(), pending = inst.pending_tokens();
        const auto co = inst.coefficients(b + 1);
        if (!b && !pending) {
            if (idle_seen) continue;
            idle_seen = true;
        }
        candidates.push_back(Candidate{
            co.first + co.second * static_cast<double>(inst.k_base() + b * inst.it0() + pending + tokens),
            static_cast<int64_t>(j)});
    }
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& x, const Candidate& y) {
        return x.bound < y.bound || (x.bound == y.bound && x.j < y.j);
    });
    int64_t best = -1;
    double best_step = std::numeric_limits<double>::infinity();
    for (const Candidate& c : candidates) {
        if (c.bound >= best_step) {
            if (c.bound > best_step) break;
            if (c.j > best) continue;
        }
        const BatchingDecode& inst = pool[static_cast<size_t>(c.j)];
        if (inst.waiting()) continue;
        const int64_t context = inst.context_tokens(now) + inst.pending_tokens() + tokens;
        if (context + inst.batch() + 1 > capacity_tokens || inst.batch() + 1 + inst.pending_requests() > max_running)
            continue;
        const auto co = inst.coefficients(inst.batch() + 1);
        const double step = co.first + co.second * static_cast<double>(context);
        if (check_tbt && step > tbt_slo_s) continue;
        if (step < best_step || (step == best_step && c.j < best)) {
            best = c.j;
            best_step = step;
        }
    }
    return best;
}

// numpy's pairwise summation of float64 (the add loop's reduction, numpy/_core/src/umath/loops_utils.h
// pairwise_sum): fewer than 8 terms one by one, up to 128 in 8 interleaved accumulators, more split in
// two halves (the first a multiple of 8).
inline double numpy_pairwise_sum(const double* a, size_t n) {
    if (n < 8) {
        double res = -0.0;
        for (size_t i = 0; i < n; ++i) res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (size_t j = 0; j < 8; ++j) r[j] = a[j];
        size_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return numpy_pairwise_sum(a, n2) + numpy_pairwise_sum(a + n2, n - n2);
}

// np.add.reduce of a[0..n) (n >= 1) as np.add.reduceat makes each segment's sum: the first term, plus
// the pairwise sum of the others.
inline double numpy_segment_sum(const double* a, size_t n) {
    return n > 1 ? a[0] + numpy_pairwise_sum(a + 1, n - 1) : a[0];
}

// v[0..m) in ascending order (the same values as numpy's sort): a request's intervals are a few
// ascending runs (one per stretch of iterations between two events), merged pairwise (into a scratch
// buffer and back, in turn).
inline void merge_runs(double* v, size_t m, std::vector<size_t>& runs) {
    runs.assign(1, 0);
    for (size_t i = 1; i < m; ++i)
        if (v[i] < v[i - 1]) runs.push_back(i);
    if (runs.size() == 1) return;
    if (runs.size() > 64) {  // many short runs: a plain sort
        std::sort(v, v + m);
        return;
    }
    runs.push_back(m);
    static thread_local std::vector<double> merged;
    std::vector<double>& scratch = merged;
    if (scratch.size() < m) scratch.resize(m);
    double *src = v, *dst = scratch.data();
    while (runs.size() > 2) {
        size_t out = 1;
        size_t r = 0;
        for (; r + 2 < runs.size(); r += 2) {
            std::merge(src + runs[r], src + runs[r + 1], src + runs[r + 1], src + runs[r + 2], dst + runs[r]);
            runs[out++] = runs[r + 2];
        }
        if (r + 1 < runs.size()) {  // an odd run left over: copied as it is
            std::copy(src + runs[r], src + runs[r + 1], dst + runs[r]);
            runs[out++] = runs[r + 1];
        }
        runs.resize(out);
        std::swap(src, dst);
    }
    if (src != v) std::copy(src, src + m, v);
}

// merge_runs, but a first interval above the second (the wait before the first token is added to it:
// most requests) is set aside, the others sorted and it moved in where it belongs, rather than merged
// as a run of its own.
inline void sort_runs(double* v, size_t m, std::vector<size_t>& runs) {
    if (m < 3 || !(v[1] < v[0])) {
        merge_runs(v, m, runs);
        return;
    }
    merge_runs(v + 1, m - 1, runs);
    const double first = v[0];
    double* at = std::lower_bound(v + 1, v + m, first);  // the first of the others not below it
    std::memmove(v, v + 1, static_cast<size_t>(at - (v + 1)) * sizeof(double));
    *(at - 1) = first;
}

// sim/decode.py tail_means: per request q (intervals[offsets[q]..offsets[q + 1]), sorted in place here)
// its TBT (the mean of the largest ceil(share x n) intervals), largest and mean interval; 0 without any.
inline void tail_means(const std::vector<int64_t>& offsets, std::vector<double>& intervals, double share,
                       std::vector<double>& tbt, std::vector<double>& top, std::vector<double>& mean) {
    tbt.clear();
    top.clear();
    mean.clear();
    static thread_local std::vector<size_t> runs_scratch;
    std::vector<size_t>& runs = runs_scratch;
    for (size_t q = 0; q + 1 < offsets.size(); ++q) {
        const size_t a = static_cast<size_t>(offsets[q]), b = static_cast<size_t>(offsets[q + 1]);
        const size_t m = b - a;
        if (m == 0) {
            tbt.push_back(0.0);
            top.push_back(0.0);
            mean.push_back(0.0);
            continue;
        }
        double* v = intervals.data() + a;
        sort_runs(v, m, runs);
        const int64_t k = static_cast<int64_t>(std::ceil(share * static_cast<double>(m) - 1e-9));
        const size_t kk = static_cast<size_t>(k < 1 ? 1 : k);
        tbt.push_back(numpy_segment_sum(v + (m - kk), kk) / static_cast<double>(kk));
        top.push_back(v[m - 1]);
        mean.push_back(numpy_segment_sum(v, m) / static_cast<double>(m));
    }
}

}  // namespace mooncake
