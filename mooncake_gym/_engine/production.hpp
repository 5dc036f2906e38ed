// The production routers of mooncake_gym/baselines/production.py, natively: each rule's scores in
// the reference's float operations and order, its ties drawn from the policy's generator as the
// reference draws them (_Seeded._argmin, _Picker._least / _pick: rng.integers(len(ties)) only when
// there is a tie), and its running state (Dynamo's and llm-d's active blocks, vLLM's request-stats
// window, Preble's load window) kept here during a run. Included by engine.hpp after Pcg64.
//
// Change a rule on one side, change it on the other: tests/test_engine_production.py compares them
// decision by decision.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <queue>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mooncake {

// The fields of RoutingView the production rules read, for the pending request.
struct ProdView {
    double now = 0.0;
    int64_t input_tokens = 0;
    const int32_t* blocks = nullptr;  // the request's blocks (dense indices: one per distinct block id)
    int64_t n_blocks = 0;
    const int64_t* unique_ids = nullptr;  // dense index -> the trace's block id (chbl's key)
    int64_t n_unique = 0;                 // distinct blocks of the trace (dense indices below it)
    size_t n = 0;
    const int64_t* hit_blocks = nullptr;
    const int64_t* hit_tokens = nullptr;
    int64_t best_hit_tokens = 0;
    const double* queue_s = nullptr;
    const double* prefill_s = nullptr;
    const int64_t* queued_requests = nullptr;
    const int64_t* queued_tokens = nullptr;
    const int64_t* cache_blocks = nullptr;
};

// CPython's sum() of floats: plain additions from 0.0 before 3.12, Neumaier-compensated from 3.12.
inline double py_sum(const std::vector<double>& xs, bool compensated) {
    double total = 0.0, c = 0.0;
    for (const double x : xs) {
        if (compensated) {
            const double t = total + x;
            c += std::fabs(total) >= std::fabs(x) ? (total - t) + x : (x - t) + total;
            total = t;
        } else {
            total += x;
        }
    }
    if (compensated && c != 0.0 && std::isfinite(c)) total += c;
    return total;
}

// numpy's random_interval(max): masked rejection on 32-bit draws (64-bit above 2**32 - 1), as
// Generator.shuffle / permutation draw their swaps.
inline uint64_t random_interval(Pcg64& rng, uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
        while ((value = (rng.next32() & mask)) > max) {
        }
    } else {
        while ((value = (rng.next64() & mask)) > max) {
        }
    }
    return value;
}

// Generator.permutation(n): arange(n) shuffled by Fisher-Yates from the last position down.
inline std::vector<int64_t> permutation(Pcg64& rng, int64_t n) {
    std::vector<int64_t> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = i;
    for (int64_t i = n - 1; i >= 1; --i) {
        const uint64_t j = random_interval(rng, static_cast<uint64_t>(i));
        std::swap(out[static_cast<size_t>(i)], out[static_cast<size_t>(j)]);
    }
    return out;
}

// numpy's _shuffle_int(n, first, data) (Generator.choice's): positions n-1 down to ``first`` swapped
// with a Lemire draw in 0..i (random_bounded_uint64, as integers(i + 1))
inline void shuffle_tail(Pcg64& rng, std::vector<int64_t>& data, int64_t first) {
    for (int64_t i = static_cast<int64_t>(data.size()) - 1; i >= first; --i) {
        const int64_t j = rng.integers(i + 1);
        std::swap(data[static_cast<size_t>(i)], data[static_cast<size_t>(j)]);
    }
}

// Generator.choice(n, size=d, replace=False) for n <= 10000: Floyd's algorithm (for j from n - d to
// n - 1 a Lemire draw v in 0..j, kept if not taken yet, else j kept), then the sample shuffled
// (shuffle=True). (numpy tail-shuffles instead for n > 10000: not ported.)
inline std::vector<int64_t> choice_without_replacement(Pcg64& rng, int64_t n, int64_t d) {
    if (n > 10000) throw std::invalid_argument("choice: the engine ports numpy's Floyd sampling (n <= 10000) only");
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(d));
    for (int64_t j = n - d; j < n; ++j) {
        const int64_t v = rng.integers(j + 1);
        out.push_back(std::find(out.begin(), out.end(), v) == out.end() ? v : j);
    }
    shuffle_tail(rng, out, 1);
    return out;
}

// production.py _mix64 (SplitMix64's finaliser), on the id's 64-bit two's complement as Python's masks make it
inline uint64_t mix64(uint64_t x) {
    x = x + 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// _Picker._pick over ``ties``: the only one, else ties[rng.integers(len(ties))].
inline int64_t pick(const std::vector<int64_t>& ties, Pcg64& rng) {
    if (ties.size() == 1) return ties[0];
    return ties[static_cast<size_t>(rng.integers(static_cast<int64_t>(ties.size())))];
}

// _Seeded._argmin / _Picker._least: the smallest value's index (among ``among`` if given), ties at random.
template <typename T>
int64_t least(const std::vector<T>& values, Pcg64& rng, std::vector<int64_t>& ties,
              const std::vector<int64_t>* among = nullptr) {
    ties.clear();
    const size_t m = among ? among->size() : values.size();
    auto at = [&](size_t j) { return among ? static_cast<size_t>((*among)[j]) : j; };
    T best = values[at(0)];
    for (size_t j = 1; j < m; ++j)
        if (values[at(j)] < best) best = values[at(j)];
    for (size_t j = 0; j < m; ++j)
        if (values[at(j)] == best) ties.push_back(static_cast<int64_t>(at(j)));
    return pick(ties, rng);
}

// _Picker._argmax (the argmin of the negated scores): the largest value's index, ties at random.
template <typename T>
int64_t most(const std::vector<T>& values, Pcg64& rng, std::vector<int64_t>& ties) {
    ties.clear();
    T best = values[0];
    for (size_t j = 1; j < values.size(); ++j)
        if (values[j] > best) best = values[j];
    for (size_t j = 0; j < values.size(); ++j)
        if (values[j] == best) ties.push_back(static_cast<int64_t>(j));
    return pick(ties, rng);
}

enum class Production { Dynamo, LlmD, SGLang, VLLMPrefix, VLLMKVAware, AIBrix, Preble, LMetric, P2C, CHBL };

// One production router: its rule, its knobs (in the order of mooncake_gym/_engine/routing.py
// PRODUCTION_KNOBS) and its running state, fresh at the start of a run as the policy's reset() leaves it.
struct ProductionRouter {
    Production rule = Production::LMetric;
    std::vector<double> knobs;
    double block_tokens = 512.0;   // production.py's BLOCK_TOKENS
    bool compensated_sum = false;  // CPython >= 3.12's sum() of floats

    // ActiveBlocks (dynamo, llmd): per instance, block -> in-flight requests holding it (a flat
    // array of (block, instance) counts where it has at most flat_limit cells, else a hash map per
    // instance) and the number of distinct blocks held; the requests' finish times in a heap
    // (finish, order, instance, blocks, n)
    using Finishing = std::tuple<double, int64_t, size_t, const int32_t*, int64_t>;
    int64_t flat_limit = int64_t(1) << 24;
    bool flat = false;
    std::vector<int32_t> flat_refs;
    std::vector<std::unordered_map<int32_t, int32_t>> refs;
    std::vector<int64_t> active;
    std::priority_queue<Finishing, std::vector<Finishing>, std::greater<Finishing>> finishing;
    int64_t order = 0;
    // _QPSWindow (vllm_prefix, vllm_kvaware): each instance's dispatch times in the window
    std::vector<std::deque<double>> sent;
    // PrebleE2: (time, instance, prefill s) of the window's dispatches, each instance's load and count
    std::deque<std::tuple<double, size_t, double>> history;
    std::vector<double> load;
    std::vector<int64_t> count;
    // ConsistentHashBoundedLoad's ring: sorted point hashes and their owners
    std::vector<uint64_t> ring_keys;
    std::vector<int64_t> ring_owners;
    bool started = false;  // the state above made for the pool's n instances

    // scratch
    std::vector<double> d_;
    std::vector<int64_t> i_, ties_, cand_;

    double knob(size_t j) const { return knobs.at(j); }

    void start(size_t n, int64_t n_unique) {
        flat = needs_active() && static_cast<int64_t>(n) * n_unique <= flat_limit;
        flat_refs.assign(flat ? n * static_cast<size_t>(n_unique) : 0, 0);
        refs.assign(n, {});
        active.assign(n, 0);
        finishing = decltype(finishing)();
        order = 0;
        sent.assign(n, {});
        history.clear();
        load.assign(n, 0.0);
        count.assign(n, 0);
        ring_keys.clear();
        ring_owners.clear();
        started = true;
    }

    int64_t operator()(const ProdView& v, Pcg64& rng) {
        if (!started || refs.size() != v.n) start(v.n, v.n_unique);
        switch (rule) {
            case Production::Dynamo: return dynamo(v, rng);
            case Production::LlmD: return llmd(v, rng);
            case Production::SGLang: return sglang(v, rng);
            case Production::VLLMPrefix: return vllm_prefix(v, rng);
            case Production::VLLMKVAware: return vllm_kvaware(v, rng);
            case Production::AIBrix: return aibrix(v, rng);
            case Production::Preble: return preble(v, rng);
            case Production::LMetric: return lmetric(v, rng);
            case Production::P2C: return p2c(v, rng);
            case Production::CHBL: return chbl(v);
        }
        throw std::logic_error("production: unknown rule");
    }

    // --- ActiveBlocks ---
    bool needs_active() const { return rule == Production::Dynamo || rule == Production::LlmD; }
    int32_t* flat_ref(size_t i, int32_t b) { return &flat_refs[static_cast<size_t>(b) * refs.size() + i]; }
    void expire(double now) {
        while (!finishing.empty() && std::get<0>(finishing.top()) <= now) {
            const auto [f, o, i, ids, m] = finishing.top();
            finishing.pop();
            for (int64_t j = 0; j < m; ++j) {
                if (flat) {
                    active[i] -= --*flat_ref(i, ids[j]) == 0;
                    continue;
                }
                auto& r = refs[i];
                auto it = r.find(ids[j]);
                if (it->second == 1) {
                    r.erase(it);
                    --active[i];
                } else {
                    --it->second;
                }
            }
        }
    }
    void add(const ProdView& v, size_t i) {
        for (int64_t j = 0; j < v.n_blocks; ++j)
            active[i] += (flat ? (*flat_ref(i, v.blocks[j]))++ : refs[i][v.blocks[j]]++) == 0;
        finishing.emplace((v.now + v.queue_s[i]) + v.prefill_s[i], order++, i, v.blocks, v.n_blocks);
    }
    // decode blocks (dynamo): active blocks + the request's blocks not yet active there
    int64_t new_blocks(const ProdView& v, size_t i) {
        int64_t c = 0;
        if (flat) {
            for (int64_t j = 0; j < v.n_blocks; ++j) c += *flat_ref(i, v.blocks[j]) == 0;
            return c;
        }
        const auto& r = refs[i];
        for (int64_t j = 0; j < v.n_blocks; ++j) c += r.find(v.blocks[j]) == r.end();
        return c;
    }

    // DynamoKV: knobs overlap_weight, temperature, credit, active_request_weight
    int64_t dynamo(const ProdView& v, Pcg64& rng) {
        const double ow = knob(0), temperature = knob(1), credit = knob(2), arw = knob(3);
        expire(v.now);
        const double b = block_tokens;
        d_.resize(v.n);
        for (size_t i = 0; i < v.n; ++i) {
            const int64_t decode = active[i] + new_blocks(v, i);
            const double x = static_cast<double>(v.queued_tokens[i] + v.input_tokens) / b -
                             credit * static_cast<double>(v.hit_tokens[i]) / b;
            const double m = x > 0.0 ? x : 0.0;
            d_[i] = (ow * m + static_cast<double>(decode)) + arw * static_cast<double>(v.queued_requests[i]);
        }
        int64_t choice;
        if (temperature == 0.0) {
            choice = least(d_, rng, ties_);
        } else {  // DynamoKV.choose's softmax over normalised costs
            double lo = d_[0], hi = d_[0];
            for (const double c : d_) {
                if (c < lo) lo = c;
                if (c > hi) hi = c;
            }
            if (hi == lo) {
                choice = rng.integers(static_cast<int64_t>(v.n));
            } else {
                const double scale = (hi - lo) * temperature;
                std::vector<double> w(v.n);
                for (size_t i = 0; i < v.n; ++i) w[i] = std::exp(-(d_[i] - lo) / scale);
                const double u = rng.random() * py_sum(w, compensated_sum);
                double acc = 0.0;
                choice = static_cast<int64_t>(v.n) - 1;
                for (size_t i = 0; i < v.n; ++i) {
                    acc += w[i];
                    if (u < acc) {
                        choice = static_cast<int64_t>(i);
                        break;
                    }
                }
            }
        }
        add(v, static_cast<size_t>(choice));
        return choice;
    }

    // LlmD / LlmDPrecise: knobs prefix_weight, queue_weight, kv_weight
    int64_t llmd(const ProdView& v, Pcg64& rng) {
        const double pw = knob(0), qw = knob(1), kw = knob(2);
        expire(v.now);
        i_.resize(v.n);
        for (size_t i = 0; i < v.n; ++i) i_[i] = v.queued_requests[i] > 0 ? v.queued_requests[i] - 1 : 0;  // _waiting
        int64_t qmax = i_[0], qmin = i_[0];
        for (const int64_t x : i_) {
            if (x > qmax) qmax = x;
            if (x < qmin) qmin = x;
        }
        const int64_t total = v.n_blocks;
        d_.resize(v.n);
        for (size_t i = 0; i < v.n; ++i) {
            const double s = qmax == qmin ? 1.0 : static_cast<double>(qmax - i_[i]) / static_cast<double>(qmax - qmin);
            const double p = total ? static_cast<double>(v.hit_blocks[i]) / static_cast<double>(total) : 0.0;
            const int64_t a = active[i];
            const int64_t c = v.cache_blocks[i];
            double u;
            if (c > 0) {
                const double r = static_cast<double>(a) / static_cast<double>(c);
                u = r < 1.0 ? r : 1.0;
            } else {
                u = a > 0 ? 1.0 : 0.0;
            }
            d_[i] = (pw * p + qw * s) + kw * (1.0 - u);
        }
        const int64_t choice = most(d_, rng, ties_);
        add(v, static_cast<size_t>(choice));
        return choice;
    }

    // SGLangCacheAware: knobs cache_threshold, balance_abs_threshold, balance_rel_threshold
    int64_t sglang(const ProdView& v, Pcg64& rng) {
        const double cache_threshold = knob(0), abs_t = knob(1), rel_t = knob(2);
        i_.assign(v.queued_requests, v.queued_requests + v.n);
        const int64_t lmax = *std::max_element(i_.begin(), i_.end());
        const int64_t lmin = *std::min_element(i_.begin(), i_.end());
        if (static_cast<double>(lmax - lmin) > abs_t && static_cast<double>(lmax) > rel_t * static_cast<double>(lmin))
            return least(i_, rng, ties_);
        std::vector<int64_t>& hits = cand_;
        hits.assign(v.hit_tokens, v.hit_tokens + v.n);
        const int64_t best = most(hits, rng, ties_);
        if (v.input_tokens &&
            static_cast<double>(hits[static_cast<size_t>(best)]) / static_cast<double>(v.input_tokens) > cache_threshold)
            return best;
        return least(i_, rng, ties_);
    }

    // _QPSWindow: the requests sent to each instance in the last window_s seconds
    void qps_counts(double now, double window_s) {
        const double start = now - window_s;
        i_.resize(sent.size());
        for (size_t i = 0; i < sent.size(); ++i) {
            auto& d = sent[i];
            while (!d.empty() && d.front() <= start) d.pop_front();
            i_[i] = static_cast<int64_t>(d.size());
        }
    }
    int64_t lowest_qps(const ProdView& v, double window_s, Pcg64& rng) {
        qps_counts(v.now, window_s);
        return least(i_, rng, ties_);
    }
    int64_t sent_to(const ProdView& v, double window_s, int64_t i) {
        qps_counts(v.now, window_s);
        sent[static_cast<size_t>(i)].push_back(v.now);
        return i;
    }

    // VLLMPrefix: knobs min_match_tokens, window_s
    int64_t vllm_prefix(const ProdView& v, Pcg64& rng) {
        const double min_match = knob(0), window_s = knob(1);
        int64_t best = v.hit_blocks[0];
        for (size_t i = 1; i < v.n; ++i)
            if (v.hit_blocks[i] > best) best = v.hit_blocks[i];
        if (min_match != 0.0 && static_cast<double>(best) * block_tokens < min_match)
            return sent_to(v, window_s, lowest_qps(v, window_s, rng));
        ties_.clear();
        for (size_t i = 0; i < v.n; ++i)
            if (v.hit_blocks[i] == best) ties_.push_back(static_cast<int64_t>(i));
        return sent_to(v, window_s, pick(ties_, rng));
    }

    // VLLMKVAware: knobs kv_aware_threshold, window_s
    int64_t vllm_kvaware(const ProdView& v, Pcg64& rng) {
        const double threshold = knob(0), window_s = knob(1);
        const int64_t best = v.best_hit_tokens;
        const double floor_ = static_cast<double>(v.input_tokens) - threshold;
        if (best > 0 && static_cast<double>(best) >= (floor_ > 0.0 ? floor_ : 0.0)) {
            ties_.clear();
            for (size_t i = 0; i < v.n; ++i)
                if (v.hit_tokens[i] == best) ties_.push_back(static_cast<int64_t>(i));
            return sent_to(v, window_s, pick(ties_, rng));
        }
        return sent_to(v, window_s, lowest_qps(v, window_s, rng));
    }

    // AIBrixPrefixCache: knobs imbalance_factor, imbalance_min_gap, std_factor
    int64_t aibrix(const ProdView& v, Pcg64& rng) {
        const double factor = knob(0), min_gap = knob(1), std_factor = knob(2);
        const int64_t* r = v.queued_requests;
        const size_t n = v.n;
        int64_t sum = 0, rmin = r[0], rmax = r[0];
        for (size_t i = 0; i < n; ++i) {
            sum += r[i];
            if (r[i] < rmin) rmin = r[i];
            if (r[i] > rmax) rmax = r[i];
        }
        const double mean = static_cast<double>(sum) / static_cast<double>(n);
        double sd = 0.0;
        if (n > 1) {
            d_.resize(n);
            for (size_t i = 0; i < n; ++i) {
                const double x = static_cast<double>(r[i]) - mean;
                d_[i] = x * x;
            }
            sd = std::sqrt(py_sum(d_, compensated_sum) / static_cast<double>(n - 1));
        }
        cand_.clear();
        const bool gate = static_cast<double>(rmax) > factor * (mean + 1.0) && static_cast<double>(rmax - rmin) >= min_gap;
        for (size_t i = 0; i < n; ++i)
            if (!gate || r[i] == rmin) cand_.push_back(static_cast<int64_t>(i));
        const int64_t total = v.n_blocks;
        i_.resize(n);  // percent
        for (size_t i = 0; i < n; ++i) i_[i] = total ? 100 * v.hit_blocks[i] / total : 0;
        std::vector<int64_t> matched;
        for (const int64_t i : cand_)
            if (i_[static_cast<size_t>(i)] > 0) matched.push_back(i);
        if (matched.size() > 1) {
            const std::vector<int64_t> perm = permutation(rng, static_cast<int64_t>(matched.size()));
            std::vector<int64_t> shuffled(matched.size());
            for (size_t j = 0; j < perm.size(); ++j) shuffled[j] = matched[static_cast<size_t>(perm[j])];
            matched.swap(shuffled);
        }
        std::stable_sort(matched.begin(), matched.end(), [&](int64_t a, int64_t b) {
            const int64_t pa = i_[static_cast<size_t>(a)], pb = i_[static_cast<size_t>(b)];
            if (pa != pb) return pa > pb;
            return r[a] < r[b];
        });
        const double limit = mean + std_factor * sd;
        for (const int64_t i : matched)
            if (static_cast<double>(r[i]) <= limit) return i;
        cand_.assign(r, r + n);
        return least(cand_, rng, ties_);
    }

    // PrebleE2: knobs window_s, rebalance_ratio
    int64_t preble(const ProdView& v, Pcg64& rng) {
        const double window_s = knob(0), ratio = knob(1);
        const double start = v.now - window_s;
        while (!history.empty() && std::get<0>(history.front()) <= start) {
            const auto [t, i, s] = history.front();
            history.pop_front();
            count[i] -= 1;
            load[i] = count[i] ? load[i] - s : 0.0;
        }
        const int64_t best = v.best_hit_tokens;
        int64_t i = -1;
        if (best > v.input_tokens - best) {
            cand_.clear();
            for (size_t j = 0; j < v.n; ++j)
                if (v.hit_tokens[j] == best) cand_.push_back(static_cast<int64_t>(j));
            i = least(load, rng, ties_, &cand_);
            const double lmin = *std::min_element(load.begin(), load.end());
            if (load[static_cast<size_t>(i)] > ratio * lmin) i = -1;
        }
        if (i < 0) {
            d_.resize(v.n);
            for (size_t j = 0; j < v.n; ++j) d_[j] = load[j] + v.prefill_s[j];
            i = least(d_, rng, ties_);
        }
        const size_t c = static_cast<size_t>(i);
        history.emplace_back(v.now, c, v.prefill_s[c]);
        load[c] += v.prefill_s[c];
        count[c] += 1;
        return i;
    }

    // LMetric: (queued tokens + uncached tokens) * (queued requests + 1), lowest wins
    int64_t lmetric(const ProdView& v, Pcg64& rng) {
        i_.resize(v.n);
        for (size_t i = 0; i < v.n; ++i)
            i_[i] = (v.queued_tokens[i] + v.input_tokens - v.hit_tokens[i]) * (v.queued_requests[i] + 1);
        return least(i_, rng, ties_);
    }

    // PowerOfTwoChoices: knob choices; ``choices`` distinct instances drawn, the fewest queued requests wins
    int64_t p2c(const ProdView& v, Pcg64& rng) {
        const int64_t n = static_cast<int64_t>(v.n);
        const int64_t c = static_cast<int64_t>(knob(0));
        const std::vector<int64_t> sample = choice_without_replacement(rng, n, c < n ? c : n);
        i_.assign(v.queued_requests, v.queued_requests + v.n);
        return least(i_, rng, ties_, &sample);
    }

    // ConsistentHashBoundedLoad: knobs balance, prefix_blocks, virtual_nodes (no draws)
    int64_t chbl(const ProdView& v) {
        const double balance = knob(0);
        const int64_t prefix_blocks = static_cast<int64_t>(knob(1)), virtual_nodes = static_cast<int64_t>(knob(2));
        const int64_t n = static_cast<int64_t>(v.n);
        if (ring_keys.empty()) {
            std::vector<std::pair<uint64_t, int64_t>> points;
            for (int64_t i = 0; i < n; ++i)
                for (int64_t p = 0; p < virtual_nodes; ++p)
                    points.emplace_back(mix64(static_cast<uint64_t>(i * 1000003 + p)), i);
            std::sort(points.begin(), points.end());
            for (const auto& [h, i] : points) {
                ring_keys.push_back(h);
                ring_owners.push_back(i);
            }
        }
        uint64_t key = 0;
        if (v.n_blocks) {
            const int64_t j = (prefix_blocks < v.n_blocks ? prefix_blocks : v.n_blocks) - 1;
            key = mix64(static_cast<uint64_t>(v.unique_ids[v.blocks[j]]));
        }
        int64_t sum = 0;
        for (size_t i = 0; i < v.n; ++i) sum += v.queued_requests[i];
        const double cap = std::ceil(balance * static_cast<double>(sum + 1) / static_cast<double>(n));
        const size_t m = ring_keys.size();
        const size_t s = static_cast<size_t>(std::lower_bound(ring_keys.begin(), ring_keys.end(), key) - ring_keys.begin());
        for (size_t step = 0; step < m; ++step) {
            const int64_t i = ring_owners[(s + step) % m];
            if (static_cast<double>(v.queued_requests[i]) < cap) return i;
        }
        throw std::logic_error("chbl: no instance below the bounded-load capacity");
    }
};

}  // namespace mooncake
