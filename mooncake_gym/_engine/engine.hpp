// The native engine's core: the prefill pool's routing simulator of mooncake_gym/sim/routing.py
// (RoutingSimulator and simulate, with sim/prefixcache.py and sim/prefill.py) and the native routing
// policies (random, load, cache, kvcentric), in C++17 with no Python types. module.cpp binds it.
//
// Every formula follows its Python reference operation for operation, in the same order, so that the
// results are the same doubles (docs/engine.md; tests/test_engine_*.py compare them decision by
// decision): change one side, change the other.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mooncake {

// --- numpy's PCG64 and Generator.integers ----------------------------------------------------
// numpy.random.PCG64 (PCG XSL-RR 128/64): the state advances by one LCG step, then a 64-bit output
// is made from the new state. ``next32`` keeps the upper half of a 64-bit output for the next call
// (numpy's has_uint32/uinteger), which Generator.integers uses for ranges below 2**32.
struct Pcg64 {
    unsigned __int128 state = 0, inc = 0;
    bool has_uint32 = false;
    uint32_t uinteger = 0;

    uint64_t next64() {
        const unsigned __int128 mult =
            (static_cast<unsigned __int128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;
        state = state * mult + inc;
        const uint64_t x = static_cast<uint64_t>(state >> 64) ^ static_cast<uint64_t>(state);
        const unsigned rot = static_cast<unsigned>(state >> 122);
        return (x >> rot) | (x << ((64u - rot) & 63u));
    }
    uint32_t next32() {
        if (has_uint32) {
            has_uint32 = false;
            return uinteger;
        }
        const uint64_t next = next64();
        has_uint32 = true;
        uinteger = static_cast<uint32_t>(next >> 32);
        return static_cast<uint32_t>(next & 0xffffffffULL);
    }
    // ``Generator.integers(n)`` for 1 <= n <= 2**32 (int64 result): no draw for n == 1, else
    // Lemire's bounded multiply on 32-bit draws with rejection, as numpy's random_bounded_uint64_fill.
    int64_t integers(int64_t n) {
        if (n < 1 || n > (int64_t(1) << 32)) throw std::invalid_argument("integers: n out of 1..2**32");
        const uint64_t rng = static_cast<uint64_t>(n - 1);
        if (rng == 0) return 0;
        if (rng == 0xFFFFFFFFULL) return static_cast<int64_t>(next32());
        const uint32_t r = static_cast<uint32_t>(rng);
        const uint32_t rng_excl = r + 1;
        uint64_t m = static_cast<uint64_t>(next32()) * rng_excl;
        uint32_t leftover = static_cast<uint32_t>(m & 0xFFFFFFFFULL);
        if (leftover < rng_excl) {
            const uint32_t threshold = (UINT32_MAX - r) % rng_excl;
            while (leftover < threshold) {
                m = static_cast<uint64_t>(next32()) * rng_excl;
                leftover = static_cast<uint32_t>(m & 0xFFFFFFFFULL);
            }
        }
        return static_cast<int64_t>(m >> 32);
    }
};

// --- the trace ----------------------------------------------------------------------------------
// The trace in flat columns: request k's blocks are blocks[block_start[k] .. block_start[k+1]),
// each block id replaced by its dense index 0..n_unique-1 (unique_ids maps it back), so that the
// caches below are arrays indexed by block, with no hashing at run time.
struct TraceColumns {
    std::vector<double> arrival_s;
    std::vector<int64_t> input_tokens;
    std::vector<int64_t> block_start;
    std::vector<int32_t> blocks;
    std::vector<int64_t> unique_ids;

    TraceColumns(std::vector<double> arrival, std::vector<int64_t> input, std::vector<int64_t> start,
                 const int64_t* ids, size_t n_ids)
        : arrival_s(std::move(arrival)), input_tokens(std::move(input)), block_start(std::move(start)) {
        if (block_start.size() != arrival_s.size() + 1 || input_tokens.size() != arrival_s.size())
            throw std::invalid_argument("trace: columns of different lengths");
        if (block_start.front() != 0 || block_start.back() != static_cast<int64_t>(n_ids))
            throw std::invalid_argument("block_start: expected offsets from 0 to len(block_ids)");
        for (size_t k = 1; k < block_start.size(); ++k)
            if (block_start[k] < block_start[k - 1]) throw std::invalid_argument("block_start: not sorted");
        if (n_ids >= (size_t(1) << 31)) throw std::invalid_argument("block_ids: at most 2**31 - 1 blocks");
        std::unordered_map<int64_t, int32_t> dense;
        dense.reserve(n_ids / 2 + 16);
        blocks.resize(n_ids);
        for (size_t j = 0; j < n_ids; ++j) {
            auto it = dense.emplace(ids[j], static_cast<int32_t>(unique_ids.size()));
            if (it.second) unique_ids.push_back(ids[j]);
            blocks[j] = it.first->second;
        }
    }
    int64_t size() const { return static_cast<int64_t>(arrival_s.size()); }
    int64_t n_unique() const { return static_cast<int64_t>(unique_ids.size()); }
};

// --- the prefix caches (sim/prefixcache.py, LRU) -----------------------------------------------
// Every instance's cache over the trace's dense block indices: a bit per (block, instance) says who
// holds the block (so one pass over a request's blocks matches every cache), and per instance a
// doubly linked list through the blocks it holds, from least to most recently used.
class PrefixCaches {
  public:
    PrefixCaches(std::vector<int64_t> capacity, int64_t n_blocks)
        : capacity_(std::move(capacity)), n_blocks_(n_blocks),
          words_((capacity_.size() + 63) / 64), holders_(static_cast<size_t>(n_blocks) * words_, 0),
          prev_(capacity_.size()), next_(capacity_.size()), head_(capacity_.size(), -1),
          tail_(capacity_.size(), -1), size_(capacity_.size(), 0), alive_(words_) {
        for (size_t i = 0; i < capacity_.size(); ++i)
            if (capacity_[i] > 0) {  // a cache of 0 blocks holds nothing: no list
                // not initialised: a block's links are read only while its holder bit is set
                prev_[i].reset(new int32_t[static_cast<size_t>(n_blocks)]);
                next_[i].reset(new int32_t[static_cast<size_t>(n_blocks)]);
            }
    }

    size_t n_instances() const { return capacity_.size(); }
    int64_t size(size_t i) const { return size_[i]; }

    // ks[i] = the leading blocks of blocks[0..n) held by instance i (match_all)
    void match(const int32_t* blocks, int64_t n, int64_t* ks) {
        const size_t n_inst = capacity_.size();
        for (size_t i = 0; i < n_inst; ++i) ks[i] = n;
        for (size_t w = 0; w < words_; ++w)
            alive_[w] = (w + 1 < words_ || n_inst % 64 == 0) ? ~uint64_t(0) : ((uint64_t(1) << (n_inst % 64)) - 1);
        for (int64_t j = 0; j < n; ++j) {
            const uint64_t* h = holders_.data() + static_cast<size_t>(blocks[j]) * words_;
            bool any = false;
            for (size_t w = 0; w < words_; ++w) {
                const uint64_t a = alive_[w];
                if (!a) continue;
                uint64_t dropped = a & ~h[w];
                while (dropped) {
                    ks[w * 64 + static_cast<size_t>(__builtin_ctzll(dropped))] = j;
                    dropped &= dropped - 1;
                }
                alive_[w] = a & h[w];
                any |= alive_[w] != 0;
            }
            if (!any) return;
        }
    }

    bool holds(size_t i, int32_t b) const {
        return (holders_[static_cast<size_t>(b) * words_ + i / 64] >> (i % 64)) & 1u;
    }

    // PrefixCache.insert on instance i: touch or insert the blocks last to first, then evict the
    // least recently used until the cache fits its capacity
    void insert(size_t i, const int32_t* blocks, int64_t n) {
        const int64_t cap = capacity_[i];
        if (cap == 0) return;
        int32_t* prev = prev_[i].get();
        int32_t* next = next_[i].get();
        int32_t& head = head_[i];
        int32_t& tail = tail_[i];
        const size_t word = i / 64;
        const uint64_t bit = uint64_t(1) << (i % 64);
        for (int64_t j = n - 1; j >= 0; --j) {
            const int32_t b = blocks[j];
            uint64_t& h = holders_[static_cast<size_t>(b) * words_ + word];
            if (h & bit) {
                if (b == tail) continue;  // already the most recent
                const int32_t p = prev[b], q = next[b];  // unlink (b is not the tail: q >= 0)
                if (p >= 0) next[p] = q; else head = q;
                prev[q] = p;
            } else {
                h |= bit;
                ++size_[i];
            }
            prev[b] = tail;  // push back
            next[b] = -1;
            if (tail >= 0) next[tail] = b; else head = b;
            tail = b;
        }
        while (size_[i] > cap) {  // evict the head
            const int32_t b = head;
            head = next[b];
            if (head >= 0) prev[head] = -1; else tail = -1;
            holders_[static_cast<size_t>(b) * words_ + word] &= ~bit;
            --size_[i];
        }
    }

    // instance i's blocks from least to most recently used (dense indices)
    std::vector<int32_t> lru_first(size_t i) const {
        std::vector<int32_t> out;
        for (int32_t b = head_[i]; b >= 0; b = next_[i][static_cast<size_t>(b)]) out.push_back(b);
        return out;
    }

  private:
    std::vector<int64_t> capacity_;
    int64_t n_blocks_;
    size_t words_;
    std::vector<uint64_t> holders_;
    std::vector<std::unique_ptr<int32_t[]>> prev_, next_;
    std::vector<int32_t> head_, tail_;
    std::vector<int64_t> size_;
    std::vector<uint64_t> alive_;
};

// --- prefill time (model/costmodel.py PrefillTime.__call__) ------------------------------------
// The constants are PrefillTime's fields, exported from Python (mooncake_gym/_engine/routing.py):
// this function is only its arithmetic.
struct PrefillTime {
    int64_t n_layers = 1;
    double linear = 0, attention = 0, flops = 1;
    int64_t kv_bytes = 0;
    double bandwidth = 1;
    bool loads = true, overlap = true;
    double overhead_s = 0;
    bool realistic = false;
    int64_t chunk = 1;
    double weights_s = 0, step_fixed_s = 0, ar_token_s = 0, attention_efficiency = 1;
    double kv_token_s = 0, elementwise_token_s = 0;

    // each chunk p..e: max(linear FLOPs, weights' read) + max(attention FLOPs, read of the e keys' KV)
    // + iteration overhead + (all-reduce + element-wise) per token, in Python's order of operations
    double chunked_compute(int64_t n, int64_t h) const {
        const double layers = static_cast<double>(n_layers);
        const double attn = attention / attention_efficiency;
        const double per_token = ar_token_s + elementwise_token_s;
        double busy = 0.0;
        int64_t p = h;
        while (p < n) {
            int64_t e = p + chunk;
            if (e > n) e = n;
            const double c = layers * linear * static_cast<double>(e - p) / flops;
            const double a = layers * attn * static_cast<double>(e * (e + 1) - p * (p + 1)) / flops;
            const double r = kv_token_s * static_cast<double>(e);
            busy += (((c > weights_s ? c : weights_s) + (a > r ? a : r)) + step_fixed_s) +
                    per_token * static_cast<double>(e - p);
            p = e;
        }
        return busy;
    }
    double operator()(int64_t n, int64_t h) const {
        const double layers = static_cast<double>(n_layers);
        double compute;
        if (realistic)
            compute = chunked_compute(n, h);
        else
            compute = layers * (linear * static_cast<double>(n - h) +
                                attention * static_cast<double>(n * (n + 1) - h * (h + 1))) / flops;
        const double load = (h > 0 && loads) ? static_cast<double>(h * kv_bytes) / bandwidth : 0.0;
        double busy;
        if (overlap)
            busy = compute >= load ? compute + load / layers : load + compute / layers;
        else
            busy = compute + load;
        return busy + overhead_s;
    }
};

// The pool's block size and RDMA transfer (CostModel.hit_tokens, CostModel.transfer_s: the first
// instance's cost model, as PrefixEstimates).
struct PoolCosts {
    int64_t block_tokens = 512;
    int64_t kv_bytes_per_token = 0;
    double rdma_bandwidth = 1;
    double transfer_latency_s = 0;

    int64_t hit_tokens(int64_t blocks, int64_t input_tokens) const {
        int64_t t = blocks * block_tokens;
        if (t > input_tokens - 1) t = input_tokens - 1;
        return t > 0 ? t : 0;
    }
    double transfer_s(int64_t tokens) const {
        if (tokens <= 0) return 0.0;
        return static_cast<double>(tokens * kv_bytes_per_token) / rdma_bandwidth + transfer_latency_s;
    }
};

// --- the routing simulator -------------------------------------------------------------------
enum class Policy { Random, Load, Cache, KVCentric };

// One dispatched request's outcome: RoutingSimulator's row (sim/routing.py _ARRAYS).
struct Row {
    double arrival_s;
    double input_tokens;
    double instance;
    double ttft_s, queue_s, transfer_s, prefill_s;
    double hit_tokens, fetched_tokens;
};
static_assert(sizeof(Row) == 9 * sizeof(double), "Row is read as a (n, 9) float64 array");

// The prefill pool's exact state and the pending request's view (the fields of RoutingView that
// the native policies read), made at each arrival as RoutingSimulator._make_view makes them.
class RoutingEngine {
  public:
    RoutingEngine(std::shared_ptr<const TraceColumns> trace, std::vector<int64_t> cache_blocks,
                  std::vector<int32_t> group, std::vector<PrefillTime> prefill, PoolCosts pool)
        : trace_ptr_(std::move(trace)), trace_(*trace_ptr_), cache_blocks_(std::move(cache_blocks)), group_(std::move(group)),
          prefill_(std::move(prefill)), pool_(pool) {
        const size_t n = cache_blocks_.size();
        if (n == 0) throw std::invalid_argument("cache_blocks: expected at least one instance");
        if (group_.size() != n) throw std::invalid_argument("group: expected one cost-model index per instance");
        for (int32_t g : group_)
            if (g < 0 || static_cast<size_t>(g) >= prefill_.size())
                throw std::invalid_argument("group: index out of the prefill times");
        reset();
    }

    int64_t n_instances() const { return static_cast<int64_t>(cache_blocks_.size()); }
    int64_t index() const { return k_; }
    bool done() const { return k_ >= trace_.size(); }
    const std::vector<Row>& rows() const { return rows_; }
    const std::vector<double>& busy_s() const { return busy_s_; }
    const std::vector<double>& busy_until() const { return busy_until_; }  // (the cluster reads it: cluster.hpp)
    const std::vector<int64_t>& requests() const { return requests_; }
    // instance i's cached block ids from least to most recently used (PrefixCache.blocks_lru_first)
    std::vector<int64_t> cache_lru_first(int64_t i) const {
        std::vector<int64_t> out;
        for (int32_t b : caches_->lru_first(static_cast<size_t>(i))) out.push_back(trace_.unique_ids[static_cast<size_t>(b)]);
        return out;
    }

    void reset() {
        const size_t n = cache_blocks_.size();
        caches_ = std::make_unique<PrefixCaches>(cache_blocks_, trace_.n_unique());
        finishes_.assign(n, std::deque<double>());
        tokens_.assign(n, std::deque<int64_t>());
        for (std::vector<int64_t>* v : {&queued_tokens_, &view_queued_, &view_queued_tokens_, &requests_, &ks_, &hits_})
            v->assign(n, 0);
        for (std::vector<double>* v : {&busy_until_, &busy_s_, &prefills_, &transfers_, &pulls_, &queue_, &costs_})
            v->assign(n, 0.0);
        branch_.assign(n, 0);
        rows_.clear();
        rows_.reserve(static_cast<size_t>(trace_.size()));
        k_ = 0;
        viewed_ = false;
    }

    // The pending request's view fields (PrefixEstimates.estimate and pool_load).
    void make_view() {
        const int64_t k = k_;
        const double now = trace_.arrival_s[k];
        const int64_t n_in = trace_.input_tokens[k];
        const int32_t* ids = trace_.blocks.data() + trace_.block_start[k];
        const int64_t n_ids = trace_.block_start[k + 1] - trace_.block_start[k];
        const size_t n = cache_blocks_.size();
        caches_->match(ids, n_ids, ks_.data());
        int64_t best_blocks = 0;
        for (size_t i = 0; i < n; ++i)
            if (ks_[i] > best_blocks) best_blocks = ks_[i];
        const int64_t best = pool_.hit_tokens(best_blocks, n_in);
        best_hit_ = best;
        best_instance_ = -1;
        if (best_blocks > 0)
            for (size_t i = 0; i < n; ++i)
                if (ks_[i] == best_blocks) {
                    best_instance_ = static_cast<int64_t>(i);
                    break;
                }
        // one prefill-time call per distinct (hit, kind of instance) in a row of equal ones
        int64_t last_k = -1;
        int32_t last_g = -1;
        double pull_prefill = 0.0;
        int32_t pull_g = -1;
        for (size_t i = 0; i < n; ++i) {
            const int32_t g = group_[i];
            if (g != pull_g) {
                pull_prefill = prefill_[static_cast<size_t>(g)](n_in, best);
                pull_g = g;
            }
            if (ks_[i] == last_k && g == last_g) {
                hits_[i] = hits_[i - 1];
                prefills_[i] = prefills_[i - 1];
                transfers_[i] = transfers_[i - 1];
                pulls_[i] = pulls_[i - 1];
            } else {
                const int64_t h = pool_.hit_tokens(ks_[i], n_in);
                const double p = prefill_[static_cast<size_t>(g)](n_in, h);
                hits_[i] = h;
                prefills_[i] = p;
                if (h < best) {
                    transfers_[i] = pool_.transfer_s(best - h);
                    pulls_[i] = pull_prefill;
                } else {
                    transfers_[i] = 0.0;
                    pulls_[i] = p;
                }
                last_k = ks_[i];
                last_g = g;
            }
            // pool_load: a busy instance forgets the requests finished by now
            const double b = busy_until_[i];
            if (b > now) {
                std::deque<double>& f = finishes_[i];
                while (!f.empty() && f.front() <= now) {
                    f.pop_front();
                    queued_tokens_[i] -= tokens_[i].front();
                    tokens_[i].pop_front();
                }
                queue_[i] = b - now;
                view_queued_[i] = static_cast<int64_t>(f.size());
                view_queued_tokens_[i] = queued_tokens_[i];
            } else {
                queue_[i] = 0.0;
                view_queued_[i] = 0;
                view_queued_tokens_[i] = 0;
            }
        }
        viewed_ = true;
    }

    // RoutingSimulator.serve(i, pull) on the pending view.
    void serve(int64_t inst, bool pull) {
        if (!viewed_) make_view();
        const size_t i = static_cast<size_t>(inst);
        const int64_t k = k_;
        const double now = trace_.arrival_s[k];
        const int64_t n_in = trace_.input_tokens[k];
        int64_t hit = hits_[i];
        double transfer = 0.0;
        int64_t fetched = 0;
        double prefill;
        if (pull && best_hit_ > hit) {
            transfer = transfers_[i];
            fetched = best_hit_ - hit;
            hit = best_hit_;
            prefill = pulls_[i];
        } else {
            prefill = prefills_[i];
        }
        const double queue = queue_[i];
        const double service = transfer + prefill;
        // PrefillInstance.dispatch
        double start;
        if (busy_until_[i] > now) {
            start = busy_until_[i];
        } else {  // idle: everything dispatched before has finished
            start = now;
            finishes_[i].clear();
            tokens_[i].clear();
            queued_tokens_[i] = 0;
        }
        const double finish = start + service;
        busy_until_[i] = finish;
        finishes_[i].push_back(finish);
        tokens_[i].push_back(n_in - hit);
        queued_tokens_[i] += n_in - hit;
        busy_s_[i] += service;
        requests_[i] += 1;
        caches_->insert(i, trace_.blocks.data() + trace_.block_start[k], trace_.block_start[k + 1] - trace_.block_start[k]);
        const double ttft = (queue + transfer) + prefill;
        rows_.push_back(Row{now, static_cast<double>(n_in), static_cast<double>(inst), ttft, queue, transfer,
                            prefill, static_cast<double>(hit), static_cast<double>(fetched)});
        k_ = k + 1;
        viewed_ = false;
    }

    // RoutingSimulator.pass_over: the pending request takes no prefill and touches no cache.
    void skip() {
        k_ += 1;
        viewed_ = false;
    }

    // The native policy's answer on the pending view (instance, pull).
    std::pair<int64_t, bool> decide(Policy policy, double threshold, Pcg64& rng) {
        if (!viewed_) make_view();
        const size_t n = cache_blocks_.size();
        switch (policy) {
            case Policy::Random:
                return {rng.integers(static_cast<int64_t>(n)), false};
            case Policy::Load:
                return {argmin(queue_, rng), false};
            case Policy::Cache:
                for (size_t i = 0; i < n; ++i) costs_[i] = queue_[i] + prefills_[i];
                return {argmin(costs_, rng), false};
            case Policy::KVCentric: {
                const int64_t best = best_hit_;
                const double best_d = static_cast<double>(best);
                for (size_t i = 0; i < n; ++i) {
                    const int64_t h = hits_[i];
                    const bool tb = best > h && (h == 0 || best_d / static_cast<double>(h) > threshold);
                    branch_[i] = tb;
                    costs_[i] = tb ? (queue_[i] + transfers_[i]) + pulls_[i] : queue_[i] + prefills_[i];
                }
                const int64_t i = argmin(costs_, rng);
                return {i, branch_[static_cast<size_t>(i)] != 0};
            }
        }
        throw std::logic_error("decide: unknown policy");
    }

    // simulate(): every remaining request routed by the native policy.
    void run(Policy policy, double threshold, Pcg64& rng) {
        while (!done()) {
            const auto [i, pull] = decide(policy, threshold, rng);
            serve(i, pull);
        }
    }

    // the pending view's fields (for tests and the step-able interface)
    const std::vector<int64_t>& view_hit_blocks() { ensure_view(); return ks_; }
    const std::vector<int64_t>& view_hit_tokens() { ensure_view(); return hits_; }
    const std::vector<double>& view_prefill_s() { ensure_view(); return prefills_; }
    const std::vector<double>& view_transfer_s() { ensure_view(); return transfers_; }
    const std::vector<double>& view_pull_prefill_s() { ensure_view(); return pulls_; }
    const std::vector<double>& view_queue_s() { ensure_view(); return queue_; }
    int64_t view_best_hit_tokens() { ensure_view(); return best_hit_; }
    int64_t view_best_instance() { ensure_view(); return best_instance_; }
    const std::vector<int64_t>& view_queued_requests() { ensure_view(); return view_queued_; }
    const std::vector<int64_t>& view_queued_tokens() { ensure_view(); return view_queued_tokens_; }
    double arrival_s(int64_t k) const { return trace_.arrival_s[static_cast<size_t>(k)]; }
    int64_t input_tokens(int64_t k) const { return trace_.input_tokens[static_cast<size_t>(k)]; }

  private:
    std::shared_ptr<const TraceColumns> trace_ptr_;
    const TraceColumns& trace_;
    std::vector<int64_t> cache_blocks_;
    std::vector<int32_t> group_;
    std::vector<PrefillTime> prefill_;
    PoolCosts pool_;

    std::unique_ptr<PrefixCaches> caches_;
    std::vector<double> busy_until_, busy_s_;
    // PrefillInstance's queue: finish times and computed tokens of the requests not known finished
    std::vector<std::deque<double>> finishes_;
    std::vector<std::deque<int64_t>> tokens_;
    std::vector<int64_t> queued_tokens_, view_queued_, view_queued_tokens_;
    int64_t best_instance_ = -1;
    std::vector<int64_t> requests_;
    std::vector<Row> rows_;
    int64_t k_ = 0;
    bool viewed_ = false;
    // the pending view
    std::vector<int64_t> ks_, hits_;
    std::vector<double> prefills_, transfers_, pulls_, queue_, costs_;
    std::vector<char> branch_;
    int64_t best_hit_ = 0;

    void ensure_view() {
        if (done()) throw std::out_of_range("view: the trace is exhausted");
        if (!viewed_) make_view();
    }

    // _Seeded._argmin: the first minimum if it is unique, else one of the tied indices drawn with
    // rng.integers(len(ties)).
    static int64_t argmin(const std::vector<double>& costs, Pcg64& rng) {
        const size_t n = costs.size();
        double best = costs[0];
        for (size_t i = 1; i < n; ++i)
            if (costs[i] < best) best = costs[i];
        size_t first = n, count = 0;
        for (size_t i = 0; i < n; ++i)
            if (costs[i] == best) {
                if (count == 0) first = i;
                ++count;
            }
        if (count == 1) return static_cast<int64_t>(first);
        int64_t pick = rng.integers(static_cast<int64_t>(count));
        for (size_t i = first; i < n; ++i)
            if (costs[i] == best && pick-- == 0) return static_cast<int64_t>(i);
        throw std::logic_error("argmin: no tie found");
    }
};

}  // namespace mooncake
