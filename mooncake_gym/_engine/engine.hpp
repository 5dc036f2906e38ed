// The native engine's core: the prefill pool's routing simulator of mooncake_gym/sim/routing.py
// (RoutingSimulator and simulate, with sim/prefixcache.py and sim/prefill.py) and the native routing
// policies (random, load, cache, kvcentric), in C++17 with no Python types. module.cpp binds it.
//
// Every formula follows its Python reference operation for operation, in the same order, so that the
// results are the same doubles (docs/engine.md; tests/test_engine_*.py compare them decision by
// decision): change one side, change the other.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "batch.hpp"
#include "batching.hpp"

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
    // ``Generator.random()``: the top 53 bits of a 64-bit output, as numpy's next_double
    double random() { return static_cast<double>(next64() >> 11) * (1.0 / 9007199254740992.0); }
};

}  // namespace mooncake

#include "production.hpp"

namespace mooncake {

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
    // seen[k]: the distinct blocks of requests 0..k-1. Dense indices follow first appearance, so
    // those are exactly the indices below seen[k]: the caches' state before request k lives there.
    std::vector<int32_t> seen;

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
        blocks.resize(n_ids);
        seen.assign(arrival_s.size() + 1, 0);
        if (!map_dense(ids, n_ids)) map_hashed(ids, n_ids);
    }
    int64_t size() const { return static_cast<int64_t>(arrival_s.size()); }
    int64_t n_unique() const { return static_cast<int64_t>(unique_ids.size()); }

  private:
    // ids numbered 0, 1, 2, ... in order of first appearance already (the synthetic generator's):
    // each is its own dense index, no hashing. False (and nothing kept) at the first id that is not.
    bool map_dense(const int64_t* ids, size_t n_ids) {
        int64_t next = 0;
        size_t k = 0;
        for (size_t j = 0; j < n_ids; ++j) {
            while (static_cast<int64_t>(j) >= block_start[k + 1]) seen[++k] = static_cast<int32_t>(next);
            const int64_t b = ids[j];
            if (b < 0 || b > next) {
                std::fill(seen.begin(), seen.end(), 0);
                return false;
            }
            if (b == next) ++next;
            blocks[j] = static_cast<int32_t>(b);
        }
        while (k < arrival_s.size()) seen[++k] = static_cast<int32_t>(next);
        unique_ids.resize(static_cast<size_t>(next));
        for (int64_t b = 0; b < next; ++b) unique_ids[static_cast<size_t>(b)] = b;
        return true;
    }
    void map_hashed(const int64_t* ids, size_t n_ids) {
        std::unordered_map<int64_t, int32_t> dense;
        dense.reserve(n_ids / 2 + 16);
        size_t k = 0;
        for (size_t j = 0; j < n_ids; ++j) {
            while (static_cast<int64_t>(j) >= block_start[k + 1]) seen[++k] = static_cast<int32_t>(unique_ids.size());
            auto it = dense.emplace(ids[j], static_cast<int32_t>(unique_ids.size()));
            if (it.second) unique_ids.push_back(ids[j]);
            blocks[j] = it.first->second;
        }
        while (k < arrival_s.size()) seen[++k] = static_cast<int32_t>(unique_ids.size());
    }
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
    int64_t capacity(size_t i) const { return capacity_[i]; }

    // A copy of the state held in blocks 0..upto-1 (a snapshot: every block outside holds nothing),
    // in arrays of upto entries.
    PrefixCaches(const PrefixCaches& s, int32_t upto) : PrefixCaches(s.capacity_, upto) {
        copy_blocks(s, upto, upto);
    }
    // Restore a snapshot ``s`` of the same pool (its arrays hold blocks 0..s.n_blocks_-1): this
    // pool's blocks from there up to ``clear_upto`` are emptied (they hold nothing in ``s``).
    void restore(const PrefixCaches& s, int32_t clear_upto) {
        copy_blocks(s, static_cast<int32_t>(s.n_blocks_), clear_upto);
    }

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
    void copy_blocks(const PrefixCaches& s, int32_t upto, int32_t clear_upto) {
        const size_t u = static_cast<size_t>(upto);
        std::copy(s.holders_.begin(), s.holders_.begin() + static_cast<std::ptrdiff_t>(u * words_), holders_.begin());
        if (clear_upto > upto)
            std::fill(holders_.begin() + static_cast<std::ptrdiff_t>(u * words_),
                      holders_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(clear_upto) * words_), 0);
        for (size_t i = 0; i < capacity_.size(); ++i)
            if (prev_[i]) {
                std::copy(s.prev_[i].get(), s.prev_[i].get() + u, prev_[i].get());
                std::copy(s.next_[i].get(), s.next_[i].get() + u, next_[i].get());
            }
        head_ = s.head_;
        tail_ = s.tail_;
        size_ = s.size_;
    }

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
    // PrefillTime.chunk_compute_s, chunk_attention_s and iteration_s: one iteration of several prompts'
    // chunks (batching.hpp), the terms of chunked_compute in the same operations
    double chunk_compute_s(int64_t p, int64_t e) const {
        return static_cast<double>(n_layers) * linear * static_cast<double>(e - p) / flops;
    }
    double chunk_attention_s(int64_t p, int64_t e) const {
        const double a = static_cast<double>(n_layers) * (attention / attention_efficiency) *
                         static_cast<double>(e * (e + 1) - p * (p + 1)) / flops;
        const double r = kv_token_s * static_cast<double>(e);
        return a > r ? a : r;
    }
    double iteration_s(double compute_s, int64_t tokens, double attention_s) const {
        return (((compute_s > weights_s ? compute_s : weights_s) + attention_s) + step_fixed_s) +
               (ar_token_s + elementwise_token_s) * static_cast<double>(tokens);
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
enum class Policy { Random, Load, Cache, KVCentric, SizeSplit, RelSplit, Production };

// A native policy's rule, knobs and running state. sizesplit and relsplit follow
// mooncake_gym/baselines/sizesplit.py (SizeSplit, RelativeSizeSplit and its ServiceScale) operation for operation.
struct PolicySpec {
    Policy kind = Policy::KVCentric;
    double threshold = 1.0;                        // kvcentric, sizesplit, relsplit
    bool has_long = false;                         // sizesplit: long_s is not None
    double long_s = 0.0;                           // sizesplit
    int64_t long_instances = 2;                    // sizesplit, relsplit
    double work_weight = 0.0;                      // sizesplit, relsplit
    bool has_factor = false;                       // relsplit: long_factor is not None
    double long_factor = 0.0, min_load = 0.0;      // relsplit
    double decay = 0.999;                          // relsplit: ServiceScale.decay
    bool compensated_sum = false;                  // CPython >= 3.12's sum() of floats
    double scale_sum = 0.0, scale_weight = 0.0;    // relsplit: ServiceScale's _sum, _weight
    double load_s = 0.0;                           // relsplit: _load_s of the last decision
    ProductionRouter prod;                         // Production: the rule, its knobs and running state (production.hpp)

    // SizeSplit._is_long / RelativeSizeSplit._is_long (which counts the request in its scale)
    bool is_long(double size_s) {
        if (kind == Policy::SizeSplit) return has_long && size_s > long_s;
        const double mean_s = scale_weight > 0 ? scale_sum / scale_weight : 0.0;  // (None reads as 0: falsy)
        const double mean = mean_s != 0.0 ? mean_s : size_s;
        const double r = mean_s == 0.0 ? 1.0 : size_s / mean_s;
        scale_sum = decay * scale_sum + size_s;
        scale_weight = decay * scale_weight + 1.0;
        return has_factor && r > long_factor && load_s >= min_load * mean;
    }
};

// One dispatched request's outcome: RoutingSimulator's row (sim/routing.py _ARRAYS).
struct Row {
    double arrival_s;
    double input_tokens;
    double instance;
    double ttft_s, queue_s, transfer_s, prefill_s;
    double hit_tokens, fetched_tokens;
};
static_assert(sizeof(Row) == 9 * sizeof(double), "Row is read as a (n, 9) float64 array");

// The rows in chunks shared between the engine and its snapshots: a snapshot copies the chunks'
// pointers, and the engine copies a chunk before it appends to one a snapshot holds (so a snapshot
// costs no copy of the rows).
class RowLog {
  public:
    static constexpr size_t CHUNK = 64;
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    const Row& back() const { return (*chunks_.back())[(size_ - 1) % CHUNK]; }
    void clear() {
        chunks_.clear();
        size_ = 0;
    }
    void push_back(const Row& r) {
        if (size_ % CHUNK == 0) {
            chunks_.push_back(std::make_shared<std::vector<Row>>());
            chunks_.back()->reserve(CHUNK);
        } else if (chunks_.back().use_count() > 1) {  // shared with a snapshot: copy on write
            auto own = std::make_shared<std::vector<Row>>(*chunks_.back());
            own->reserve(CHUNK);
            chunks_.back() = std::move(own);
        }
        std::vector<Row>& c = *chunks_.back();
        c.resize(size_ % CHUNK);  // (a restored log may hold a longer chunk's tail: drop it)
        c.push_back(r);
        ++size_;
    }
    const Row& at(size_t pos) const { return (*chunks_[pos / CHUNK])[pos % CHUNK]; }
    // replace row pos (copy on write where a snapshot shares its chunk)
    void set(size_t pos, const Row& r) {
        std::shared_ptr<std::vector<Row>>& c = chunks_[pos / CHUNK];
        if (c.use_count() > 1) c = std::make_shared<std::vector<Row>>(*c);
        (*c)[pos % CHUNK] = r;
    }
    void copy_to(Row* out) const {
        size_t left = size_;
        for (const auto& c : chunks_) {
            const size_t m = left < CHUNK ? left : CHUNK;
            std::memcpy(out, c->data(), m * sizeof(Row));
            out += m;
            left -= m;
        }
    }

  private:
    std::vector<std::shared_ptr<std::vector<Row>>> chunks_;
    size_t size_ = 0;
};

// The prefill pool's exact state and the pending request's view (the fields of RoutingView that
// the native policies read), made at each arrival as RoutingSimulator._make_view makes them.
class RoutingEngine {
  public:
    RoutingEngine(std::shared_ptr<const TraceColumns> trace, std::vector<int64_t> cache_blocks,
                  std::vector<int32_t> group, std::vector<PrefillTime> prefill, PoolCosts pool)
        : trace_ptr_(std::move(trace)), trace_(trace_ptr_.get()), cache_blocks_(std::move(cache_blocks)), group_(std::move(group)),
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
    int64_t last_index() const { return last_index_; }
    bool done() const { return k_ >= trace_->size(); }
    const RowLog& rows() const { return rows_; }
    const std::vector<double>& busy_s() const { return busy_s_; }
    const std::vector<double>& busy_until() const { return busy_until_; }  // (the cluster reads it: cluster.hpp)
    const std::vector<int64_t>& requests() const { return requests_; }
    // instance i's cached block ids from least to most recently used (PrefixCache.blocks_lru_first)
    std::vector<int64_t> cache_lru_first(int64_t i) const {
        std::vector<int64_t> out;
        for (int32_t b : caches_->lru_first(static_cast<size_t>(i))) out.push_back(trace_->unique_ids[static_cast<size_t>(b)]);
        return out;
    }

    // A copy of the whole state (the pool, its caches, the rows, the pending view), for restore():
    // the caches' arrays are copied only over the blocks seen so far, and the rows are shared.
    std::unique_ptr<RoutingEngine> snapshot() const { return std::unique_ptr<RoutingEngine>(new RoutingEngine(*this, 0)); }
    // Back to the state of ``s``, a snapshot of this engine (same trace and pool).
    void restore(const RoutingEngine& s) {
        if (s.trace_ != trace_ || s.cache_blocks_ != cache_blocks_ || s.group_ != group_)
            throw std::invalid_argument("restore: a snapshot of another simulator");
        caches_->restore(*s.caches_, trace_->seen[static_cast<size_t>(k_)]);
        copy_state(s);
    }

    // each instance's queued work at ``now`` (PrefillInstance.queue_s) and its cache's blocks (the pictures)
    std::pair<std::vector<double>, std::vector<int64_t>> pool_state(double now) const {
        std::pair<std::vector<double>, std::vector<int64_t>> out;
        for (size_t i = 0; i < cache_blocks_.size(); ++i) {
            const double q = busy_until_[i] - now;
            out.first.push_back(q > 0.0 ? q : 0.0);
            out.second.push_back(caches_->size(i));
        }
        return out;
    }

    void reset() {
        const size_t n = cache_blocks_.size();
        caches_ = std::make_unique<PrefixCaches>(cache_blocks_, trace_->n_unique());
        finishes_.assign(n, std::deque<double>());
        tokens_.assign(n, std::deque<int64_t>());
        for (std::vector<int64_t>* v : {&queued_tokens_, &view_queued_, &view_queued_tokens_, &requests_, &ks_, &hits_})
            v->assign(n, 0);
        for (std::vector<double>* v : {&busy_until_, &busy_s_, &prefills_, &transfers_, &pulls_, &queue_, &costs_})
            v->assign(n, 0.0);
        branch_.assign(n, 0);
        batchers_.clear();
        if (budget_ > 0)
            for (size_t i = 0; i < n; ++i) {
                batchers_.emplace_back(budget_, prefill_[static_cast<size_t>(group_[i])]);
                if (pipeline_depth_ > 1) {  // groups of consecutive instances, each instance's own first
                    PrefillBatcher<PrefillTime>& b = batchers_.back();
                    const size_t g = i - i % static_cast<size_t>(pipeline_depth_);
                    b.group.push_back(static_cast<int64_t>(i));
                    for (size_t j = g; j < g + static_cast<size_t>(pipeline_depth_) && j < n; ++j)
                        if (j != i) b.group.push_back(static_cast<int64_t>(j));
                    b.pipeline_min_tokens = pipeline_min_tokens_;
                    b.send_s_per_token = pipeline_send_[i][0];
                    b.send_latency_s = pipeline_send_[i][1];
                    b.stage_overhead_s = pipeline_send_[i][2];
                }
            }
        row_of_.assign(budget_ > 0 ? static_cast<size_t>(trace_->size()) : 0, -1);
        prefill_ends_.clear();
        deferred_.clear();
        rows_.clear();
        k_ = 0;
        last_index_ = -1;
        viewed_ = false;
    }

    // The pending request's view fields (PrefixEstimates.estimate and pool_load).
    void make_view() {
        const int64_t k = k_;
        const double now = trace_->arrival_s[k];
        const int64_t n_in = trace_->input_tokens[k];
        const int32_t* ids = trace_->blocks.data() + trace_->block_start[k];
        const int64_t n_ids = trace_->block_start[k + 1] - trace_->block_start[k];
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
            if (!batchers_.empty()) {  // a batching instance: its engine counts (busy_until: an estimate)
                queue_[i] = b > now ? b - now : 0.0;
                view_queued_[i] = batchers_[i].queued_requests(now, queued_tokens_[i]);
                view_queued_tokens_[i] = queued_tokens_[i];
            } else if (b > now) {
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
        const double now = trace_->arrival_s[k];
        const int64_t n_in = trace_->input_tokens[k];
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
        if (!batchers_.empty()) {  // queued for batching: TTFT known when its last iteration is formed
            row_of_[static_cast<size_t>(k)] = static_cast<int64_t>(rows_.size());
            if (fetched && defer_pulls_) {  // ready when the caller says its copy arrived (pull_arrived)
                deferred_.push_back(Pull{k, best_instance_, inst, static_cast<double>(fetched * pull_kv_bytes_per_token_)});
                batchers_[i].add(totals(i), k, now, std::numeric_limits<double>::infinity(), n_in, hit, prefill);
            } else {
                batchers_[i].add(totals(i), k, now, now + transfer, n_in, hit, prefill);
            }
            caches_->insert(i, trace_->blocks.data() + trace_->block_start[k],
                            trace_->block_start[k + 1] - trace_->block_start[k]);
            rows_.push_back(Row{now, static_cast<double>(n_in), static_cast<double>(inst), (queue + transfer) + prefill,
                                queue, transfer, prefill, static_cast<double>(hit), static_cast<double>(fetched)});
            k_ = k + 1;
            last_index_ = k;
            viewed_ = false;
            return;
        }
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
        caches_->insert(i, trace_->blocks.data() + trace_->block_start[k], trace_->block_start[k + 1] - trace_->block_start[k]);
        const double ttft = (queue + transfer) + prefill;
        rows_.push_back(Row{now, static_cast<double>(n_in), static_cast<double>(inst), ttft, queue, transfer,
                            prefill, static_cast<double>(hit), static_cast<double>(fetched)});
        k_ = k + 1;
        last_index_ = k;
        viewed_ = false;
    }

    // --- chunked prefill batching (batching.hpp), driven from outside (the cluster's event loop) ---
    // A prefix pull left to the caller (RoutingSimulator.pulls): request r's bytes from holder to instance to.
    struct Pull {
        int64_t r, holder, to;
        double bytes;
    };
    // Batch each instance's queue per iteration of up to `budget` tokens (0: one request at a time);
    // `defer_pulls`: a pull's copy is the caller's (pulls(), pull_arrived), of kv_bytes_per_token per
    // token. Starts over (reset).
    void set_batching(int64_t budget, bool defer_pulls, int64_t kv_bytes_per_token) {
        if (budget < 0) throw std::invalid_argument("prefill_token_budget: expected >= 0");
        budget_ = budget;
        defer_pulls_ = defer_pulls;
        pull_kv_bytes_per_token_ = kv_bytes_per_token;
        reset();
    }
    // Chunked pipeline parallelism (PrefillEngine.set_pipeline, as RoutingSimulator.reset sets it): groups
    // of `depth` consecutive instances; per instance (send_s_per_token, send_latency_s, stage_overhead_s).
    // Takes effect with set_batching (which starts over).
    void set_pipeline(int64_t depth, int64_t min_tokens, std::vector<std::array<double, 3>> send) {
        if (depth < 1) throw std::invalid_argument("pipeline_nodes: expected >= 1");
        if (depth > 1 && send.size() != cache_blocks_.size())
            throw std::invalid_argument("pipeline: expected one (send_s_per_token, send_latency_s, stage_overhead_s) per instance");
        pipeline_depth_ = depth;
        pipeline_min_tokens_ = min_tokens;
        pipeline_send_ = std::move(send);
    }
    bool batched() const { return !batchers_.empty(); }
    int64_t pipelined_runs(int64_t i) const { return batchers_[static_cast<size_t>(i)].pipelined_runs; }
    int64_t waiting(int64_t i) const { return batchers_[static_cast<size_t>(i)].waiting; }
    double next_start(int64_t i) const { return batchers_[static_cast<size_t>(i)].next_start(); }
    int64_t iterations(int64_t i) const { return batchers_[static_cast<size_t>(i)].iterations; }
    // RoutingSimulator.form: instance i's iteration starting at s; returns its end. The requests it ends
    // get their real TTFT in their rows (_collect) and are listed in prefill_ends().
    double form(int64_t i, double s) {
        PrefillBatcher<PrefillTime>& b = batchers_[static_cast<size_t>(i)];
        PrefillJob* pipelined = nullptr;
        double end = b.form(totals(static_cast<size_t>(i)), s, &pipelined);
        if (pipelined != nullptr) {  // its turn, alone, over the group (stage k: the group's k-th instance)
            std::vector<PrefillBatcher<PrefillTime>*> mates;
            std::vector<InstanceTotals> mate_totals;
            std::vector<InstanceTotals*> mate_ptrs;
            mate_totals.reserve(b.group.size());
            for (int64_t m : b.group) {
                mates.push_back(&batchers_[static_cast<size_t>(m)]);
                mate_totals.push_back(totals(static_cast<size_t>(m)));
            }
            for (InstanceTotals& t : mate_totals) mate_ptrs.push_back(&t);
            end = b.form_pipeline(totals(static_cast<size_t>(i)), *pipelined, s, mates, mate_ptrs);
        }
        for (const auto& [k, e] : b.ended) {
            int64_t& pos = row_of_[static_cast<size_t>(k)];
            Row row = rows_.at(static_cast<size_t>(pos));
            const double ttft = e - row.arrival_s;
            const double wait = (ttft - row.transfer_s) - row.prefill_s;
            row.ttft_s = ttft;
            row.queue_s = wait > 0.0 ? wait : 0.0;
            rows_.set(static_cast<size_t>(pos), row);
            pos = -1;
            prefill_ends_.emplace_back(k, e);
        }
        b.ended.clear();
        return end;
    }
    // RoutingSimulator.pull_arrived: request k's deferred pull reached instance i at t
    void pull_arrived(int64_t k, int64_t i, double t) {
        if (!batchers_[static_cast<size_t>(i)].ready(k, t)) throw std::logic_error("ready: request is not queued here");
    }
    std::vector<std::pair<int64_t, double>>& prefill_ends() { return prefill_ends_; }
    std::vector<Pull>& pulls() { return deferred_; }

    // RoutingSimulator.pass_over: the pending request takes no prefill and touches no cache.
    void skip() {
        last_index_ = -1;
        k_ += 1;
        viewed_ = false;
    }

    // The native policy's answer on the pending view (instance, pull).
    std::pair<int64_t, bool> decide(PolicySpec& policy, Pcg64& rng) {
        if (!viewed_) make_view();
        const size_t n = cache_blocks_.size();
        switch (policy.kind) {
            case Policy::Random:
                return {rng.integers(static_cast<int64_t>(n)), false};
            case Policy::Load:
                return {argmin(queue_, rng), false};
            case Policy::Cache:
                for (size_t i = 0; i < n; ++i) costs_[i] = queue_[i] + prefills_[i];
                return {argmin(costs_, rng), false};
            case Policy::KVCentric: {
                kvcentric_costs(policy.threshold);
                const int64_t i = argmin(costs_, rng);
                return {i, branch_[static_cast<size_t>(i)] != 0};
            }
            case Policy::SizeSplit:
            case Policy::RelSplit: {
                // mooncake_gym/baselines/sizesplit.py SizeSplit.__call__ (RelativeSizeSplit: its load first)
                if (policy.kind == Policy::RelSplit) policy.load_s = mean_queue(policy.compensated_sum);
                kvcentric_costs(policy.threshold);
                double smallest = 0.0;
                for (size_t i = 0; i < n; ++i) {
                    const double service = costs_[i] - queue_[i];
                    if (i == 0 || service < smallest) smallest = service;
                    costs_[i] = costs_[i] + policy.work_weight * service;
                }
                if (policy.is_long(smallest)) {
                    const size_t k = policy.long_instances < static_cast<int64_t>(n) ? static_cast<size_t>(policy.long_instances) : n;
                    for (size_t i = k; i < n; ++i) costs_[i] = HUGE_VAL;
                }
                const int64_t i = argmin(costs_, rng);
                return {i, branch_[static_cast<size_t>(i)] != 0};
            }
            case Policy::Production:
                return {policy.prod(production_view(), rng), false};  // (none of these routers pulls)
        }
        throw std::logic_error("decide: unknown policy");
    }

    // simulate(): every remaining request routed by the native policy.
    void run(PolicySpec& policy, Pcg64& rng) {
        while (!done()) {
            const auto [i, pull] = decide(policy, rng);
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
    double arrival_s(int64_t k) const { return trace_->arrival_s[static_cast<size_t>(k)]; }
    int64_t input_tokens(int64_t k) const { return trace_->input_tokens[static_cast<size_t>(k)]; }

  private:
    // the snapshot's copy (snapshot())
    RoutingEngine(const RoutingEngine& e, int)
        : trace_ptr_(e.trace_ptr_), trace_(e.trace_), cache_blocks_(e.cache_blocks_), group_(e.group_),
          prefill_(e.prefill_), pool_(e.pool_),
          caches_(std::make_unique<PrefixCaches>(*e.caches_, e.trace_->seen[static_cast<size_t>(e.k_)])) {
        copy_state(e);
    }
    void copy_state(const RoutingEngine& s) {
        busy_until_ = s.busy_until_;
        busy_s_ = s.busy_s_;
        finishes_ = s.finishes_;
        tokens_ = s.tokens_;
        queued_tokens_ = s.queued_tokens_;
        view_queued_ = s.view_queued_;
        view_queued_tokens_ = s.view_queued_tokens_;
        best_instance_ = s.best_instance_;
        requests_ = s.requests_;
        rows_ = s.rows_;
        k_ = s.k_;
        last_index_ = s.last_index_;
        viewed_ = s.viewed_;
        ks_ = s.ks_;
        hits_ = s.hits_;
        prefills_ = s.prefills_;
        transfers_ = s.transfers_;
        pulls_ = s.pulls_;
        queue_ = s.queue_;
        costs_ = s.costs_;
        branch_ = s.branch_;
        best_hit_ = s.best_hit_;
        budget_ = s.budget_;
        pipeline_depth_ = s.pipeline_depth_;
        pipeline_min_tokens_ = s.pipeline_min_tokens_;
        pipeline_send_ = s.pipeline_send_;
        defer_pulls_ = s.defer_pulls_;
        pull_kv_bytes_per_token_ = s.pull_kv_bytes_per_token_;
        batchers_ = s.batchers_;
        row_of_ = s.row_of_;
        prefill_ends_ = s.prefill_ends_;
        deferred_ = s.deferred_;
    }

    std::shared_ptr<const TraceColumns> trace_ptr_;
    const TraceColumns* trace_;
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
    RowLog rows_;
    int64_t k_ = 0;
    int64_t last_index_ = -1;  // the request of the last dispatch, -1 after a skip (RoutingSimulator.last)
    bool viewed_ = false;
    // the pending view
    std::vector<int64_t> ks_, hits_;
    std::vector<double> prefills_, transfers_, pulls_, queue_, costs_;
    std::vector<char> branch_;
    int64_t best_hit_ = 0;
    // chunked prefill batching (set_batching; none when budget_ is 0)
    int64_t budget_ = 0;
    bool defer_pulls_ = false;
    int64_t pull_kv_bytes_per_token_ = 0;
    std::vector<PrefillBatcher<PrefillTime>> batchers_;
    int64_t pipeline_depth_ = 1, pipeline_min_tokens_ = 0;
    std::vector<std::array<double, 3>> pipeline_send_;
    std::vector<int64_t> row_of_;  // request -> its row, until its TTFT is known
    std::vector<std::pair<int64_t, double>> prefill_ends_;
    std::vector<Pull> deferred_;  // pulls left to the caller (RoutingSimulator.pulls)

    InstanceTotals totals(size_t i) { return InstanceTotals{busy_until_[i], busy_s_[i], queued_tokens_[i], requests_[i]}; }

    // the pending view's fields the production rules read (production.hpp)
    ProdView production_view() const {
        ProdView v;
        const int64_t k = k_;
        v.now = trace_->arrival_s[static_cast<size_t>(k)];
        v.input_tokens = trace_->input_tokens[static_cast<size_t>(k)];
        v.blocks = trace_->blocks.data() + trace_->block_start[static_cast<size_t>(k)];
        v.n_blocks = trace_->block_start[static_cast<size_t>(k) + 1] - trace_->block_start[static_cast<size_t>(k)];
        v.unique_ids = trace_->unique_ids.data();
        v.n_unique = trace_->n_unique();
        v.n = cache_blocks_.size();
        v.hit_blocks = ks_.data();
        v.hit_tokens = hits_.data();
        v.best_hit_tokens = best_hit_;
        v.queue_s = queue_.data();
        v.prefill_s = prefills_.data();
        v.queued_requests = view_queued_.data();
        v.queued_tokens = view_queued_tokens_.data();
        v.cache_blocks = cache_blocks_.data();
        return v;
    }

    // KVCentric.estimates: each instance's TTFT estimate (costs_) and whether it took the transfer branch
    void kvcentric_costs(double threshold) {
        const int64_t best = best_hit_;
        const double best_d = static_cast<double>(best);
        for (size_t i = 0; i < cache_blocks_.size(); ++i) {
            const int64_t h = hits_[i];
            const bool tb = best > h && (h == 0 || best_d / static_cast<double>(h) > threshold);
            branch_[i] = tb;
            costs_[i] = tb ? (queue_[i] + transfers_[i]) + pulls_[i] : queue_[i] + prefills_[i];
        }
    }

    // sum(view.queue_s) / len(view.queue_s), as CPython's sum() adds floats (production.hpp py_sum)
    double mean_queue(bool compensated) const { return py_sum(queue_, compensated) / static_cast<double>(queue_.size()); }

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

// --- PrefillRouting-v0 on the engine (mooncake_gym/envs/prefill_routing.py) ----------------------
// The environment's observation (envs/features.py routing_features, then float32), action mask and
// reward, written by the engine into the buffers bound by the Python env, in the reference's order
// of operations.
struct RoutingEnvSpec {
    double time_scale = 1.0;  // 1 / log1p(QUEUE_CAP_SLO * ttft_slo_s / TIME_UNIT_S)
    double slo_s = 5.0;
    bool ttft_reward = true;  // reward "ttft" (else "slo")
    bool allow_pull = true;
};

constexpr double TIME_UNIT_S = 0.1;
constexpr double QUEUED_REQUESTS_CAP = 50.0;
constexpr double INPUT_TOKENS_CAP = 200000.0;
constexpr int PER_INSTANCE_FEATURES = 5;
// the info row: index, instance, pull, ttft_s, queue_s, transfer_s, prefill_s, hit_tokens,
// fetched_tokens, input_tokens (RoutingSimulator.last's fields)
constexpr int ROUTING_INFO_FIELDS = 10;

class RoutingEnv : public SteppableEnv {
  public:
    RoutingEnv(std::shared_ptr<RoutingEngine> engine, RoutingEnvSpec spec) : engine_(std::move(engine)), spec_(spec) {}

    RoutingEngine& engine() { return *engine_; }
    int64_t n_obs() const { return PER_INSTANCE_FEATURES * engine_->n_instances() + 2; }
    int64_t n_actions() const override { return spec_.allow_pull ? 2 * engine_->n_instances() : engine_->n_instances(); }
    bool done() const override { return engine_->done(); }

    double step(int64_t action, bool& terminated) override {
        const int64_t n = engine_->n_instances();
        const int64_t k = engine_->index();
        engine_->serve(action % n, action >= n);
        const Row& r = engine_->rows().back();
        if (info) {
            const double row[ROUTING_INFO_FIELDS] = {static_cast<double>(k), r.instance, r.fetched_tokens > 0 ? 1.0 : 0.0,
                                                     r.ttft_s, r.queue_s, r.transfer_s, r.prefill_s, r.hit_tokens,
                                                     r.fetched_tokens, r.input_tokens};
            std::memcpy(info, row, sizeof row);
        }
        terminated = engine_->done();
        observe();
        return spec_.ttft_reward ? -r.ttft_s / spec_.slo_s : (r.ttft_s <= spec_.slo_s ? 1.0 : 0.0);
    }

    // The pending decision's observation and mask (zeros and ones after the last request).
    void observe() {
        const size_t n = static_cast<size_t>(engine_->n_instances());
        const size_t n_obs = PER_INSTANCE_FEATURES * n + 2;
        const size_t n_mask = spec_.allow_pull ? 2 * n : n;
        if (engine_->done()) {
            if (obs) std::fill(obs, obs + n_obs, 0.0f);
            if (mask) std::fill(mask, mask + n_mask, int8_t(1));
            return;
        }
        const std::vector<int64_t>& hits = engine_->view_hit_tokens();
        const int64_t best = engine_->view_best_hit_tokens();
        if (mask) {
            std::fill(mask, mask + n, int8_t(1));
            if (spec_.allow_pull)
                for (size_t i = 0; i < n; ++i) mask[n + i] = hits[i] < best ? 1 : 0;
        }
        if (obs) features(*engine_, spec_.time_scale, obs);
    }

    static double cap1(double x) { return x < 1.0 ? x : 1.0; }

    // routing_features: per instance T(queue), queued/50, hit share, T(queue + prefill),
    // T(queue + transfer + prefill after pull); then the request's length and the best hit share.
    // An idle instance reuses the block of the first idle instance with the same hit, as the
    // reference does. (Also the prefill part of the v1 environments' observation: clusterenv.hpp.)
    static void features(RoutingEngine& e, double scale, float* out) {
        const size_t n = static_cast<size_t>(e.n_instances());
        const std::vector<double>& q = e.view_queue_s();
        const std::vector<int64_t>& nq = e.view_queued_requests();
        const std::vector<int64_t>& h = e.view_hit_tokens();
        const std::vector<double>& p = e.view_prefill_s();
        const std::vector<double>& tr = e.view_transfer_s();
        const std::vector<double>& pp = e.view_pull_prefill_s();
        const int64_t n_in = e.input_tokens(e.index());
        const double inv_in = n_in ? 1.0 / static_cast<double>(n_in) : 0.0;
        for (size_t i = 0; i < n; ++i) {
            float* b = out + PER_INSTANCE_FEATURES * i;
            if (q[i] == 0.0) {
                size_t j = 0;
                while (j < i && !(q[j] == 0.0 && h[j] == h[i])) ++j;
                if (j < i) {
                    std::memcpy(b, out + PER_INSTANCE_FEATURES * j, PER_INSTANCE_FEATURES * sizeof(float));
                    continue;
                }
            }
            const double t = q[i] + p[i];
            const double tp = (q[i] + tr[i]) + pp[i];
            const double x_q = q[i] != 0.0 ? std::log1p(q[i] / TIME_UNIT_S) * scale : 0.0;
            const double x_t = std::log1p(t / TIME_UNIT_S) * scale;
            const double x_tp = tp != t ? std::log1p(tp / TIME_UNIT_S) * scale : x_t;
            const double x_n = static_cast<double>(nq[i]) / QUEUED_REQUESTS_CAP;
            b[0] = static_cast<float>(cap1(x_q));
            b[1] = static_cast<float>(cap1(x_n));
            b[2] = static_cast<float>(static_cast<double>(h[i]) * inv_in);
            b[3] = static_cast<float>(cap1(x_t));
            b[4] = static_cast<float>(cap1(x_tp));
        }
        const double len = std::log1p(static_cast<double>(n_in)) / std::log1p(INPUT_TOKENS_CAP);
        out[PER_INSTANCE_FEATURES * n] = static_cast<float>(len < 0.0 ? 0.0 : (len > 1.0 ? 1.0 : len));
        out[PER_INSTANCE_FEATURES * n + 1] = static_cast<float>(static_cast<double>(e.view_best_hit_tokens()) * inv_in);
    }

  private:
    std::shared_ptr<RoutingEngine> engine_;
    RoutingEnvSpec spec_;
};

}  // namespace mooncake
