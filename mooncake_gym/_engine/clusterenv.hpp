// The v1 environments' core on the native cluster (mooncake_gym/envs/cluster.py ClusterEnv and its three
// subclasses; docs/engine.md "The v1 environments on the engine"): one step applies the decision to
// cluster.hpp's Cluster, scores the requests that completed since the last decision as the reference's
// _Simulator.score does, and writes the next observation (ClusterEnv._observe), the action mask
// (Conductor-v1's) and the step's info row into the buffers the env owns. Each feature is computed with
// the reference's operations in its order and then rounded to float32, as the reference's packing does,
// so that observations, rewards and infos are the reference's to the bit (tests/test_engine_v1envs.py).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "batch.hpp"
#include "cluster.hpp"

namespace mooncake {

enum class V1Kind { Routing, Admission, Conductor };

// What ClusterEnv computes once per env (its constructor's constants) and the episode's horizon.
struct ClusterEnvSpec {
    V1Kind kind = V1Kind::Routing;
    double time_scale = 1.0;                   // the prefill features' 1 / log1p(10 SLO / 0.1 s)
    double batch_cap = 256, step_den = 0.2;    // BATCH_CAP, STEP_CAP_SLO x TBT SLO
    double ttft_den = 45, in_prefill_den = 160;  // TTFT_CAP_SLO x SLO, IN_PREFILL_CAP_PER_INSTANCE x P
    double output_cap = 4096, log_output_scale = 1.0;  // OUTPUT_TOKENS_CAP, 1 / log1p(OUTPUT_TOKENS_CAP)
    double ttft_slo_s = 30, tbt_slo_s = 0.1;   // the preset's SLOs
    double capacity_tokens = 1;                // a decode instance's KV capacity (the view's)
    double reserve_tbt_s = 0.05;               // the reserve model's time per token (preset.tbt_s)
    double tail_share = 0.1;                   // sim/decode.py TBT_TAIL_SHARE
    double horizon = 0;                        // the last arrival
    bool oracle = false, prediction = false;
    double mean_output_tokens = 1, mean_prefill_s = 1, waste_penalty = 0.1;  // the goodput reward's units
};

// index, admitted, prefill_instance, good_tokens, good_requests, wasted_s, completed, rejected_at_arrival,
// rejected_after_prefill, preempted, ttft_s (NaN when rejected): ClusterEnv.step's info, in its order
constexpr int V1_INFO_FIELDS = 11;

class ClusterEnvCore : public SteppableEnv {
  public:
    ClusterEnvCore(Cluster& cluster, ClusterEnvSpec spec, std::vector<double> predicted)
        : c_(cluster), spec_(spec), predicted_(std::move(predicted)) {
        n_prefill_ = c_.pool().n_instances();
        n_decode_ = static_cast<int64_t>(c_.used().size());
        row_of_.assign(c_.outcome().size(), -1);
        seen_.assign(static_cast<size_t>(n_decode_), 0);
        scored_ = static_cast<size_t>(c_.completions().size());
        last_wasted_ = c_.wasted_prefill_s();
    }

    int64_t n_obs() const {
        return PER_INSTANCE_FEATURES * n_prefill_ + 2 + 4 * n_decode_ + 3 + (spec_.oracle ? 1 : 0) +
               (spec_.prediction ? 1 : 0);
    }
    // Conductor-v1's four dimensions flattened (admit, prefill instance, pull, decode instance) for step()
    int64_t n_actions() const override {
        if (spec_.kind == V1Kind::Routing) return 2 * n_prefill_;
        if (spec_.kind == V1Kind::Admission) return 2;
        return 2 * n_prefill_ * 2 * (n_decode_ + 1);
    }
    // the mask's length: Conductor-v1's four masks one after the other, else one per action
    int64_t n_mask() const {
        return spec_.kind == V1Kind::Conductor ? 2 + n_prefill_ + 2 + n_decode_ + 1 : n_actions();
    }
    bool done() const override { return c_.done(); }

    double step(int64_t action, bool& terminated) override {
        if (spec_.kind == V1Kind::Routing) return act(true, action % n_prefill_, action >= n_prefill_, -1, terminated);
        if (spec_.kind == V1Kind::Admission) return act(action == 1, -1, false, -1, terminated);
        const int64_t d = action % (n_decode_ + 1), rest = action / (n_decode_ + 1);
        const int64_t pull = rest % 2, inst = (rest / 2) % n_prefill_, admit = rest / 2 / n_prefill_;
        return act(admit == 1, inst, pull == 1, d, terminated);
    }

    // The decision on the pending request: admitted (on instance `inst`, pulling first if `pull`; the
    // default router's route if inst < 0; to decode instance `decode`, the default rule's if it is D or
    // < 0) or rejected; then the reward, with the info row, observation and mask written.
    double act(bool admit, int64_t inst, bool pull, int64_t decode, bool& terminated) {
        const int64_t i = c_.index();
        c_.apply(admit, admit ? inst : -1, admit && pull, decode >= n_decode_ ? -1 : decode);
        const int64_t good0 = good_tokens_, good_n0 = good_requests_;
        score();
        const double wasted = c_.wasted_prefill_s() - last_wasted_;
        last_wasted_ = c_.wasted_prefill_s();
        const Cluster::Counts n = c_.counts();
        const size_t r = static_cast<size_t>(i);
        const double ttft = admit ? c_.ttft_s()[r] : std::numeric_limits<double>::quiet_NaN();
        const int64_t good = good_tokens_ - good0;
        if (info) {
            const double row[V1_INFO_FIELDS] = {static_cast<double>(i), admit ? 1.0 : 0.0,
                                                static_cast<double>(c_.prefill_instance()[r]), static_cast<double>(good),
                                                static_cast<double>(good_requests_ - good_n0), wasted,
                                                static_cast<double>(n[0]), static_cast<double>(n[3]),
                                                static_cast<double>(n[4]), static_cast<double>(n[10]), ttft};
            std::memcpy(info, row, sizeof row);
        }
        terminated = c_.done();
        observe();
        if (spec_.kind == V1Kind::Routing) return -ttft / spec_.ttft_slo_s;
        return static_cast<double>(good) / spec_.mean_output_tokens -
               spec_.waste_penalty * wasted / spec_.mean_prefill_s;
    }

    // The pending decision's observation and mask (zeros and ones after the last request).
    void observe() {
        const size_t n_obs_ = static_cast<size_t>(n_obs());
        const size_t n_mask_ = static_cast<size_t>(n_mask());
        if (c_.done()) {
            if (obs) std::fill(obs, obs + n_obs_, 0.0f);
            if (mask) std::fill(mask, mask + n_mask_, int8_t(1));
            return;
        }
        RoutingEngine& pool = c_.pool();
        if (mask) {
            std::fill(mask, mask + n_mask_, int8_t(1));
            if (spec_.kind == V1Kind::Conductor) {  // pull 1: only where some instance's hit is short of the best
                const std::vector<int64_t>& hits = pool.view_hit_tokens();
                const int64_t best = pool.view_best_hit_tokens();
                bool any = false;
                for (int64_t h : hits) any = any || h < best;
                mask[2 + n_prefill_ + 1] = any ? 1 : 0;
            }
        }
        if (!obs) return;
        RoutingEnv::features(pool, spec_.time_scale, obs);
        float* out = obs + PER_INSTANCE_FEATURES * n_prefill_ + 2;
        const size_t i = static_cast<size_t>(c_.index());
        const double now = c_.now();
        const int64_t tokens = pool.input_tokens(c_.index());
        const double cap = spec_.capacity_tokens;
        const std::vector<BatchingDecode>& decoders = c_.decoders();
        for (int64_t j = 0; j < n_decode_; ++j) {
            BatchingDecode::Load l;
            if (!decoders.empty()) {
                l = decoders[static_cast<size_t>(j)].load(now, tokens);
            } else {  // ReservingDecodeInstance.load
                const int64_t b = c_.batch()[static_cast<size_t>(j)];
                l = {b, c_.used()[static_cast<size_t>(j)], b ? spec_.reserve_tbt_s : 0.0, spec_.reserve_tbt_s};
            }
            *out++ = clip(static_cast<double>(l.batch) / spec_.batch_cap);
            *out++ = clip(static_cast<double>(l.used) / cap);
            *out++ = clip(l.step / spec_.step_den);
            *out++ = clip(l.step_with / spec_.step_den);
        }
        const double ttft = c_.default_route().finish - now;
        *out++ = clip(ttft / spec_.ttft_den);
        *out++ = ttft > spec_.ttft_slo_s ? 1.0f : 0.0f;
        *out++ = clip(static_cast<double>(c_.counts()[8]) / spec_.in_prefill_den);
        if (spec_.oracle) *out++ = clip(static_cast<double>(c_.output_tokens()[i]) / spec_.output_cap);
        if (spec_.prediction) *out++ = clip(std::log1p(predicted_[i]) * spec_.log_output_scale);
    }

    int64_t good_tokens() const { return good_tokens_; }
    int64_t good_requests() const { return good_requests_; }

    // Snapshots: the reward's running sums, with the cluster's own snapshot (Cluster::snapshot) taken and
    // restored beside them. The rows of finished requests (row_of_) are a cache: restore makes it rescan
    // them at the next use, since the run it leaves may have finished other requests on other rows.
    struct Snapshot {
        int64_t good_tokens, good_requests;
        size_t scored;
        double last_wasted;
    };
    Snapshot snapshot() const { return {good_tokens_, good_requests_, scored_, last_wasted_}; }
    // Back to `s` (taken with the cluster's snapshot just restored); writes the pending observation and mask.
    void restore(const Snapshot& s) {
        good_tokens_ = s.good_tokens;
        good_requests_ = s.good_requests;
        scored_ = s.scored;
        last_wasted_ = s.last_wasted;
        std::fill(seen_.begin(), seen_.end(), size_t(0));
        observe();
    }

  private:
    Cluster& c_;
    ClusterEnvSpec spec_;
    std::vector<double> predicted_;
    int64_t n_prefill_ = 0, n_decode_ = 0;
    int64_t good_tokens_ = 0, good_requests_ = 0;
    size_t scored_ = 0;
    double last_wasted_ = 0.0;
    std::vector<int64_t> row_of_;  // per request: its row in its decode instance's finished(), once seen
    std::vector<size_t> seen_;     // per decode instance: the rows of finished() already in row_of_
    std::vector<double> intervals_, tbt_, top_, mean_;  // tbt_within's scratch
    std::vector<int64_t> req_, offsets_;

    // ClusterEnv's clipped(): [0, 1], NaN stays NaN; then float32
    static float clip(double x) { return static_cast<float>(x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x)); }

    // _Simulator.score: the requests completed since the last call that count in token_goodput (both SLOs
    // met, decode started by the horizon) added to the running sums
    void score() {
        const std::vector<int64_t>& done = c_.completions();
        if (scored_ == done.size()) return;
        const std::vector<double>& ttft = c_.ttft_s();
        const std::vector<double>& start = c_.decode_start_s();
        const std::vector<double>& tbt = c_.tbt_s();
        const std::vector<int64_t>& output = c_.output_tokens();
        for (; scored_ < done.size(); ++scored_) {
            const size_t r = static_cast<size_t>(done[scored_]);
            if (!(ttft[r] <= spec_.ttft_slo_s && start[r] <= spec_.horizon)) continue;
            const double t = tbt[r];
            const bool good = t == t ? t <= spec_.tbt_slo_s : tbt_within(r);
            if (good) {
                good_tokens_ += output[r];
                good_requests_ += 1;
            }
        }
    }

    // Whether the TBT of finished request r (tail_means of its token intervals) is within the TBT SLO:
    // at once where its slowest interval is clearly within (10^-9 relative), else from its intervals.
    bool tbt_within(size_t r) {
        const size_t j = static_cast<size_t>(c_.decode_instance()[r]);
        const BatchingDecode& d = c_.decoders()[j];
        const std::vector<BatchingDecode::Row>& rows = d.finished();
        for (size_t q = seen_[j]; q < rows.size(); ++q) row_of_[static_cast<size_t>(rows[q].r)] = static_cast<int64_t>(q);
        seen_[j] = rows.size();
        const size_t q = static_cast<size_t>(row_of_[r]);
        const double slo = spec_.tbt_slo_s;
        if (d.slowest_interval(q) <= slo * (1 - 1e-9)) return true;
        d.token_intervals(q, req_, offsets_, intervals_, q + 1);
        tail_means(offsets_, intervals_, spec_.tail_share, tbt_, top_, mean_);  // decode.hpp's, as finish_tbt's
        return tbt_[0] <= slo;
    }
};

}  // namespace mooncake
