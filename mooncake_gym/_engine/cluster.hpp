// The cluster simulator of mooncake_gym/sim/cluster.py (ClusterSimulator) on the native engine, for the
// clusters whose prefill pool runs one request at a time or batches each queue per iteration (chunked
// prefill, batching.hpp; each iteration an event here; a long prompt possibly pipelined over its group),
// with KV transfers over shared NICs (batching.hpp Network) or each with a whole NIC, and whose decode
// pool is either the `reserve` model (sim/decode.py ReservingDecodeInstance: input + output reserved up
// front, a fixed time per token; the `lecture` preset and the lecture's admission problem) or continuous
// batching (decode.hpp's BatchingDecode: the realistic presets' decode, with the KV copy's tail after
// the prefill, the fastest accepting instance, preemption). The prefill pool is engine.hpp's
// RoutingEngine (FIFO instances, prefix caches, pulls), as the reference's is RoutingSimulator.
//
// Every formula follows ClusterSimulator operation for operation, in the same order, so that the
// records are the same doubles (tests/test_engine_cluster.py compares them decision by decision).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "decode.hpp"
#include "engine.hpp"

namespace mooncake {

// The outcomes of sim/metrics.py.
enum Outcome : int8_t { PENDING = -1, COMPLETED = 0, REJECTED_AT_ARRIVAL = 1, REJECTED_AFTER_PREFILL = 2,
                        PREEMPTED = 3, REFUSED_TOO_LONG = 4 };

// Python's builtin sum() of floats, from 0: a left-to-right loop of + (CPython <= 3.11), or, from 3.12
// on, Neumaier's compensated sum, as bltinmodule.c makes it (`compensated`).
inline double py_sum(const double* x, size_t n, bool compensated) {
    if (n == 0) return 0.0;
    if (!compensated) {
        double s = 0.0;
        for (size_t k = 0; k < n; ++k) s += x[k];
        return s;
    }
    double s = 0.0 + x[0], c = 0.0;  // 0 + x[0]: the int start turns into the first float
    for (size_t k = 1; k < n; ++k) {
        const double t = s + x[k];
        if (std::fabs(s) >= std::fabs(x[k])) c += (s - t) + x[k];
        else c += (x[k] - t) + s;
        s = t;
    }
    if (c != 0.0 && std::isfinite(c)) s += c;
    return s;
}

// The cluster's settings (ClusterSimulator's constructor and preset), as the engine reads them.
struct ClusterSettings {
    int64_t n_decode = 1;
    int64_t capacity_tokens = 0;  // per decode instance
    double tbt_s = 0.05;          // the reserve model's time per token
    double ttft_slo_s = 30.0, tbt_slo_s = 0.1;
    double sample_period_s = 1.0;
    bool lecture_loads = false;   // load_series == "lecture"
    bool refuse_never_fit = true;
    bool compensated_sum = false; // Python >= 3.12's sum()
    double mean_output_tokens = 0.0;
    // continuous batching (decode_model "batching")
    bool batching = false;
    bool check_tbt = true;        // decode_check == "tbt"
    bool kv_transfer = true;
    DecodeSpec decode;            // the decode instances' cost model and limits
    double idle_step_s = 0.0;     // ClusterSimulator._idle_step_s
    // the prompt's KV copy to decode (the prefill cost model's CostModel.transfer_s)
    int64_t kv_bytes_per_token = 0;
    double rdma_bandwidth = 1.0, transfer_latency_s = 0.0;
    int64_t n_layers = 1;
    // the prefill pool's engines' mechanisms (the pool's RoutingEngine batches: set_batching)
    bool prefill_batching = false;  // prefill_token_budget > 0: each iteration is an event here
    int64_t prefill_token_budget = 0;
    int64_t pull_kv_bytes_per_token = 0;  // a pull's bytes per token (the pool's CostModel.kv_bytes)
    bool shared_nics = false;       // pulls and KV copies share the nodes' NICs (batching.hpp Network)
    int64_t n_prefill = 1;
    double nic_bandwidth = 1.0;     // each node's NIC (the RDMA figure)
    double pull_latency_s = 0.0;    // a pull arrives this long after its last byte (transfer_latency_s)
    int64_t pipeline_nodes = 1;     // chunked pipeline parallelism over groups of this many instances
    int64_t pipeline_min_tokens = 0;
    std::vector<std::array<double, 3>> pipeline_send;  // per instance: send s per token, send latency, stage overhead
};

// The default router of the cluster (ClusterSimulator.router) and the routing policies of simulate():
// engine.hpp's four, or the lecture's least-queue rule (sim/policies.py LeastQueue).
struct Router {
    bool least_queue = false;
    PolicySpec policy;  // its kind and threshold (engine.hpp's four rules; no running state)
    Pcg64 rng;
};

// The native admission rules (mooncake_gym/baselines/admission.py): admit all (no policy), baseline (the TTFT
// check), early rejection (the TTFT check, then the prefill and decode loads against a threshold).
enum class Admission { All, Baseline, Early };

struct ClusterEvent {
    double t;
    uint64_t order;  // the kind in the top byte, the sequence number below: (kind, seq) in one key
    int64_t r;       // the request (reserve decode, prefill done, join, pull), the decode instance (batching
                     // decode), the prefill instance (iteration) or the network's version
    int64_t j;       // the decode instance (join), the instance's version (batching decode), the prefill
                     // instance (pull)
    int kind() const { return static_cast<int>(order >> 56); }
    bool operator>(const ClusterEvent& o) const {  // heapq's tuple order (t, kind, seq)
        return t != o.t ? t > o.t : order > o.order;
    }
};

struct ClusterDefaultRoute {
    int64_t instance;
    bool pull;
    double prefill_s, finish;
};

// The part of a Cluster's state a snapshot copies whole (Cluster::snapshot; the per-request records, copied
// up to the requests that have arrived, and the prefill pool aside): the default router, the decode
// pool's counts, the events, the counters, the series and the NICs.
struct ClusterState {
    Router router_;
    std::vector<int64_t> used_, batch_;
    std::vector<ClusterEvent> heap_;
    int64_t seq_ = 0, i_ = 0;
    bool done_ = false;
    std::vector<BatchingDecode> decoders_;
    int64_t completed_ = 0, completed_in_ttft_slo_ = 0, admitted_ = 0, rejected_at_arrival_ = 0,
            rejected_after_prefill_ = 0, refused_too_long_ = 0, granted_ = 0, granted_in_ttft_slo_ = 0,
            in_prefill_ = 0, in_decode_ = 0, preempted_ = 0;
    double wasted_prefill_s_ = 0.0;
    std::vector<double> wasted_t_, wasted_s_;
    std::vector<int64_t> completions_;
    std::vector<double> samples_t_, samples_p_, samples_d_, samples_kv_;
    int64_t k_sample_ = 0;
    double next_sample_ = 0.0, horizon_ = 0.0;
    bool routed_ = false;
    ClusterDefaultRoute route_{};
    std::vector<size_t> tbt_done_;  // per decode instance: its finished requests whose TBT is set
    std::vector<char> iterating_;  // batching prefill: an iteration event is pending for the instance
    std::vector<std::vector<std::pair<double, int64_t>>> fifo_;  // batching prefill: (prefill end, request)
    Network network_;
    int64_t net_version_ = -1;  // the network's version of the pending network event
};

class Cluster : private ClusterState {
  public:
    // `pool` is the prefill pool (held by reference: its owner keeps it alive, and only this cluster
    // drives it); `trace` is the pool's trace.
    Cluster(std::shared_ptr<const TraceColumns> trace, std::vector<int64_t> output, RoutingEngine& pool,
            ClusterSettings s, Router router)
        : trace_ptr_(std::move(trace)), trace_(*trace_ptr_), output_(std::move(output)), pool_(pool), s_(s) {
        router_ = router;
        const size_t n = static_cast<size_t>(trace_.size());
        if (output_.size() != n) throw std::invalid_argument("output_tokens: expected one per request");
        if (n == 0) throw std::invalid_argument("trace: expected at least one request");
        if (s_.n_decode < 1) throw std::invalid_argument("n_decode: expected >= 1");
        footprint_.resize(n);
        never_fits_.assign(n, 0);
        for (size_t r = 0; r < n; ++r) {  // the reservation (reserve), or the prompt (batching: it grows)
            const int64_t whole = trace_.input_tokens[r] + output_[r];
            footprint_[r] = s_.batching ? trace_.input_tokens[r] : whole;
            if (s_.refuse_never_fit) never_fits_[r] = whole > s_.capacity_tokens;
        }
        if (s_.n_prefill != pool_.n_instances()) throw std::invalid_argument("n_prefill: expected the pool's instances");
        if (s_.shared_nics && !s_.prefill_batching)
            throw std::invalid_argument("shared_nics: the NICs are shared in the batching prefill's event loop");
        pool_.set_pipeline(s_.pipeline_nodes, s_.pipeline_min_tokens, s_.pipeline_send);
        pool_.set_batching(s_.prefill_batching ? s_.prefill_token_budget : 0, s_.shared_nics,
                           s_.pull_kv_bytes_per_token);
        reset(router_.rng);
    }

    // ClusterSimulator.reset with the router's generator as reset_policy left it.
    void reset(const Pcg64& rng) {
        router_.rng = rng;
        const size_t n = static_cast<size_t>(trace_.size());
        pool_.reset();
        used_.assign(static_cast<size_t>(s_.n_decode), 0);
        batch_.assign(static_cast<size_t>(s_.n_decode), 0);
        decoders_.clear();
        if (s_.batching)
            for (int64_t j = 0; j < s_.n_decode; ++j) decoders_.emplace_back(j, &s_.decode);
        reserved_.assign(n, 0);
        heap_.clear();
        seq_ = 0;
        i_ = 0;
        done_ = false;
        target_.assign(n, -1);
        outcome_.assign(n, PENDING);
        for (std::vector<double>* v : {&ttft_s_, &prefill_s_, &decode_start_s_, &end_s_, &tbt_s_, &prefill_end_s_,
                                       &max_interval_s_, &mean_interval_s_})
            v->assign(n, std::numeric_limits<double>::quiet_NaN());
        prefill_instance_.assign(n, -1);
        decode_instance_.assign(n, -1);
        completed_ = completed_in_ttft_slo_ = admitted_ = 0;
        rejected_at_arrival_ = rejected_after_prefill_ = refused_too_long_ = preempted_ = 0;
        granted_ = granted_in_ttft_slo_ = 0;
        in_prefill_ = in_decode_ = 0;
        wasted_prefill_s_ = 0.0;
        completions_.clear();
        wasted_t_.clear();
        wasted_s_.clear();
        samples_t_.clear();
        samples_p_.clear();
        samples_d_.clear();
        samples_kv_.clear();
        k_sample_ = 0;
        next_sample_ = 0.0;
        horizon_ = trace_.arrival_s.back();
        routed_ = false;
        iterating_.assign(static_cast<size_t>(s_.n_prefill), 0);
        tbt_done_.assign(decoders_.size(), 0);
        fifo_.assign(s_.prefill_batching ? static_cast<size_t>(s_.n_prefill) : 0, {});
        network_ = s_.shared_nics ? Network(s_.n_prefill + s_.n_decode, s_.nic_bandwidth) : Network();
        net_version_ = -1;
        advance();
    }

    bool done() const { return done_; }
    int64_t index() const { return i_; }
    double now() const { return i_ < trace_.size() ? trace_.arrival_s[static_cast<size_t>(i_)] : horizon_; }
    RoutingEngine& pool() { return pool_; }
    const RoutingEngine& pool() const { return pool_; }
    Pcg64& router_rng() { return router_.rng; }

    // The default router's answer on the pending request (ClusterView._default), made once per decision:
    // (instance, pull as the router gave it, prefill time on that route, predicted prefill finish).
    using DefaultRoute = ClusterDefaultRoute;
    const DefaultRoute& default_route() {
        if (done_) throw std::out_of_range("default_route: the workload is exhausted");
        if (!routed_) {
            const auto [k, pull] = route_with(router_);
            const size_t j = static_cast<size_t>(k);
            const bool pulls = pull && pool_.view_best_hit_tokens() > pool_.view_hit_tokens()[j];
            const double p = pulls ? pool_.view_transfer_s()[j] + pool_.view_pull_prefill_s()[j]
                                   : pool_.view_prefill_s()[j];
            route_ = DefaultRoute{k, pull, p, (now() + pool_.view_queue_s()[j]) + p};
            routed_ = true;
        }
        return route_;
    }

    std::pair<int64_t, bool> route_with(Router& r) {
        if (r.least_queue) {  // min(range(n), key=queue): the first least
            const std::vector<double>& q = pool_.view_queue_s();
            size_t best = 0;
            for (size_t j = 1; j < q.size(); ++j)
                if (q[j] < q[best]) best = j;
            return {static_cast<int64_t>(best), false};
        }
        return pool_.decide(r.policy, r.rng);
    }

    // The decode side of the pending view (ClusterSimulator.decode_fields under the reserve model):
    // the mean decode time (mean output x the busy instances' mean step, or tbt_s when all are idle).
    double mean_decode_s() const {
        steps_.clear();
        if (s_.batching) {
            const double t = now();
            for (const BatchingDecode& d : decoders_) {
                const double x = d.step_s(t);
                if (x > 0) steps_.push_back(x);
            }
        } else {
            for (size_t j = 0; j < batch_.size(); ++j)
                if (batch_[j]) steps_.push_back(s_.tbt_s);
        }
        const double idle = s_.batching ? s_.idle_step_s : s_.tbt_s;
        const double tbt = steps_.empty() ? idle
                                          : py_sum(steps_.data(), steps_.size(), s_.compensated_sum) /
                                                static_cast<double>(steps_.size());
        return s_.mean_output_tokens * tbt;
    }

    // The decode side of the pending view under batching: each instance's load (BatchingDecodeInstance.load)
    // at now for the pending request's prompt.
    std::vector<BatchingDecode::Load> decode_loads() const {
        std::vector<BatchingDecode::Load> out;
        const double t = now();
        const int64_t tokens = footprint_[static_cast<size_t>(i_)];
        for (const BatchingDecode& d : decoders_) out.push_back(d.load(t, tokens));
        return out;
    }

    // The native admission rule's answer on the pending view (mooncake_gym/baselines/admission.py).
    bool admits(Admission a, double ttft_slo_s, double threshold) {
        if (a == Admission::All) return true;
        const DefaultRoute& d = default_route();
        const double ttft = d.finish - now();
        if (ttft > ttft_slo_s) return false;
        if (a == Admission::Baseline) return true;
        // decode_load_with: the least of max(KV use with this request, step with it / TBT SLO)
        const double own = static_cast<double>(trace_.input_tokens[static_cast<size_t>(i_)]) + s_.mean_output_tokens;
        const double cap = static_cast<double>(s_.capacity_tokens);
        double load = 0.0;
        const double t = now();
        const int64_t tokens = footprint_[static_cast<size_t>(i_)];
        for (size_t j = 0; j < used_.size(); ++j) {
            double used = static_cast<double>(used_[j]), step = s_.tbt_s / s_.tbt_slo_s;
            if (s_.batching) {
                const BatchingDecode::Load d = decoders_[j].load(t, tokens);
                used = static_cast<double>(d.used);
                step = d.step_with / s_.tbt_slo_s;
            }
            const double kv = (used + own) / cap;
            const double l = kv > step ? kv : step;
            if (j == 0 || l < load) load = l;
        }
        const double prefill = ttft / ttft_slo_s;
        return (load > prefill ? load : prefill) <= threshold;
    }

    // ClusterSimulator.apply: the pending request admitted (with a route, or the default router's if
    // inst < 0; to decode instance `decode`, or the default rule's if < 0) or rejected.
    void apply(bool admit, int64_t inst, bool pull, int64_t decode) {
        if (done_) throw std::out_of_range("apply: the workload is exhausted");
        const int64_t i = i_;
        const size_t r = static_cast<size_t>(i);
        if (!admit) {
            outcome_[r] = REJECTED_AT_ARRIVAL;
            rejected_at_arrival_ += 1;
            pool_.skip();
        } else {
            if (inst < 0) {
                const DefaultRoute& d = default_route();
                inst = d.instance;
                pull = d.pull;
            }
            pool_.serve(inst, pull);
            const Row& row = pool_.rows().back();
            const int64_t k = static_cast<int64_t>(row.instance);
            const double now = trace_.arrival_s[r];
            admitted_ += 1;
            prefill_instance_[r] = k;
            prefill_s_[r] = row.transfer_s + row.prefill_s;
            if (decode >= 0) target_[r] = decode;
            if (s_.prefill_batching) {  // its first token's time is known once its last iteration is formed
                const double finish = now + row.ttft_s;  // the estimate at dispatch, until then (ttft_s too)
                ttft_s_[r] = row.ttft_s;
                prefill_end_s_[r] = finish;
                in_prefill_ += 1;
                fifo_[static_cast<size_t>(k)].emplace_back(finish, i);
                std::vector<RoutingEngine::Pull>& pulls = pool_.pulls();
                if (!pulls.empty()) {  // its prefix's copy, over the shared NICs
                    for (const RoutingEngine::Pull& p : pulls)
                        network_.add(now, p.holder, p.to, p.bytes, Network::Payload{PULLED_EVENT, p.r, p.to});
                    pulls.clear();
                    schedule_network();
                }
                if (!iterating_[static_cast<size_t>(k)]) start_iterations(k, now);
                i_ = i + 1;
                advance();
                return;
            }
            const double finish = pool_.busy_until()[static_cast<size_t>(k)];
            ttft_s_[r] = finish - now;
            prefill_end_s_[r] = finish;
            in_prefill_ += 1;
            push(finish, PREFILL_DONE_EVENT, i);
        }
        i_ = i + 1;
        advance();
    }

    // simulate(): every remaining decision made by the native rules (admission, then the route: the
    // routing policy `routing`'s if given, else the default router's; the decode rule at prefill end).
    void run(Admission a, double ttft_slo_s, double threshold, Router* routing) {
        while (!done_) {
            const bool admit = admits(a, ttft_slo_s, threshold);
            if (admit && routing != nullptr) {
                const auto [k, pull] = route_with(*routing);
                apply(true, k, pull, -1);
            } else {
                apply(admit, -1, false, -1);
            }
        }
    }

    // records and counters (ClusterSimulator's attributes of the same names)
    const std::vector<int8_t>& outcome() const { return outcome_; }
    const std::vector<double>& ttft_s() const { return ttft_s_; }
    const std::vector<double>& prefill_s() const { return prefill_s_; }
    const std::vector<double>& decode_start_s() const { return decode_start_s_; }
    const std::vector<double>& end_s() const { return end_s_; }
    const std::vector<double>& tbt_s() const { return tbt_s_; }
    const std::vector<double>& max_interval_s() const { return max_interval_s_; }
    const std::vector<double>& mean_interval_s() const { return mean_interval_s_; }
    const std::vector<BatchingDecode>& decoders() const { return decoders_; }
    // ClusterSimulator.finish_tbt's assignment: the TBT of request r from its token intervals
    void set_tbt(int64_t r, double tbt, double top, double mean) {
        const size_t q = static_cast<size_t>(r);
        tbt_s_[q] = tbt;
        max_interval_s_[q] = top;
        mean_interval_s_[q] = mean;
    }
    // ClusterSimulator.finish_tbt: the TBT of every request finished since the last call, from its
    // token intervals (decode.hpp tail_means, numpy's operations)
    // One request at a time (its intervals stay in the cache between made, sorted and summed; a request's
    // TBT does not depend on the others computed with it).
    void finish_tbt(double share) {
        tbt_done_.resize(decoders_.size(), 0);
        static thread_local std::vector<int64_t> req, offsets;
        static thread_local std::vector<double> intervals, tbt, top, mean;
        for (size_t j = 0; j < decoders_.size(); ++j) {
            const size_t n = decoders_[j].finished().size();
            for (size_t q = tbt_done_[j]; q < n; ++q) {
                decoders_[j].token_intervals(q, req, offsets, intervals, q + 1);
                tail_means(offsets, intervals, share, tbt, top, mean);
                for (size_t k = 0; k < req.size(); ++k) set_tbt(req[k], tbt[k], top[k], mean[k]);
            }
            tbt_done_[j] = n;
        }
    }
    const std::vector<double>& prefill_end_s() const { return prefill_end_s_; }
    const std::vector<int64_t>& prefill_instance() const { return prefill_instance_; }
    const std::vector<int64_t>& decode_instance() const { return decode_instance_; }
    const std::vector<int64_t>& used() const { return used_; }
    const std::vector<int64_t>& batch() const { return batch_; }
    const std::vector<double>& samples_t() const { return samples_t_; }
    const std::vector<double>& samples_p() const { return samples_p_; }
    const std::vector<double>& samples_d() const { return samples_d_; }
    const std::vector<double>& samples_kv() const { return samples_kv_; }
    const std::vector<double>& wasted_t() const { return wasted_t_; }
    const std::vector<double>& wasted_s() const { return wasted_s_; }
    // the counters in NativeClusterSimulator's order (completed, completed_in_ttft_slo, admitted,
    // rejected_at_arrival, rejected_after_prefill, refused_too_long, granted, granted_in_ttft_slo,
    // requests_in_prefill, requests_in_decode, preempted); counts() without a heap copy (a step reads it)
    using Counts = std::array<int64_t, 11>;
    Counts counts() const {
        return {completed_, completed_in_ttft_slo_, admitted_, rejected_at_arrival_, rejected_after_prefill_,
                refused_too_long_, granted_, granted_in_ttft_slo_, in_prefill_, in_decode_, preempted_};
    }
    std::vector<int64_t> counters() const {
        const Counts c = counts();
        return {c.begin(), c.end()};
    }
    double wasted_prefill_s() const { return wasted_prefill_s_; }
    // batching prefill: each instance's (prefill end, request) in ClusterSimulator._prefill_fifo's order
    const std::vector<std::vector<std::pair<double, int64_t>>>& prefill_fifo() const { return fifo_; }
    const Network& network() const { return network_; }
    // for the v1 environments' reward (clusterenv.hpp): the requests completed (not preempted), in the
    // order they completed, and each request's output length
    const std::vector<int64_t>& completions() const { return completions_; }
    const std::vector<int64_t>& output_tokens() const { return output_; }

  private:
    // event kinds, ordered as sim/cluster.py's at equal times
    static constexpr int DECODE_EVENT = 0, PREFILL_DONE_EVENT = 1, JOIN_EVENT = 2, PULLED_EVENT = 3, ITER_EVENT = 4,
                         NET_EVENT = 5;
    using Event = ClusterEvent;

    std::shared_ptr<const TraceColumns> trace_ptr_;
    const TraceColumns& trace_;
    std::vector<int64_t> output_, footprint_;
    std::vector<char> never_fits_;
    RoutingEngine& pool_;
    ClusterSettings s_;
    std::vector<int64_t> target_;
    std::vector<int8_t> outcome_;
    std::vector<double> ttft_s_, prefill_s_, decode_start_s_, end_s_, tbt_s_, prefill_end_s_, max_interval_s_,
        mean_interval_s_;
    std::vector<int64_t> reserved_;  // per request: the KV tokens its decode instance holds for its copy
    std::vector<Completion> ended_;
    std::vector<int64_t> prefill_instance_, decode_instance_;
    mutable std::vector<double> steps_, terms_;
    std::vector<BatchingDecode::Load> loads_;
    std::vector<Network::Payload> drained_;

    void push(double t, int kind, int64_t r, int64_t j = 0) {
        seq_ += 1;
        heap_.push_back(Event{t, (static_cast<uint64_t>(kind) << 56) | static_cast<uint64_t>(seq_), r, j});
        std::push_heap(heap_.begin(), heap_.end(), std::greater<Event>());
    }

    // ClusterSimulator._advance: events up to the next arrival needing a decision
    void advance() {
        routed_ = false;
        const int64_t n = trace_.size();
        const double inf = std::numeric_limits<double>::infinity();
        while (i_ < n) {
            const size_t i = static_cast<size_t>(i_);
            const double now = trace_.arrival_s[i];
            if (!heap_.empty() && heap_.front().t <= now) run_until(now);
            if (never_fits_[i]) {
                outcome_[i] = REFUSED_TOO_LONG;
                refused_too_long_ += 1;
                pool_.skip();
                i_ += 1;
                continue;
            }
            if (next_sample_ < now) sample_until(now);
            return;
        }
        sample_until(inf);
        run_until(inf);
        done_ = true;
    }

    void run_until(double t) {
        const double inf = std::numeric_limits<double>::infinity();
        while (!heap_.empty() && heap_.front().t <= t) {
            // a prefill iteration starting at t waits for the arrivals at t (and the NICs with it)
            if (heap_.front().kind() >= ITER_EVENT && heap_.front().t == t && t < inf) break;
            std::pop_heap(heap_.begin(), heap_.end(), std::greater<Event>());
            const Event e = heap_.back();
            heap_.pop_back();
            if (next_sample_ < e.t) sample_until(e.t);
            if (e.kind() == DECODE_EVENT) {
                if (!s_.batching) {
                    release(e.t, e.r);
                    continue;
                }
                BatchingDecode& d = decoders_[static_cast<size_t>(e.r)];
                if (d.version() == e.j) {
                    ended_.clear();
                    d.on_event(ended_);
                    if (!ended_.empty()) ended(ended_);
                    schedule(d);
                }
            } else if (e.kind() == PREFILL_DONE_EVENT) {
                prefill_done(e.t, e.r);
            } else if (e.kind() == JOIN_EVENT) {
                join(e.r, e.j, e.t);
            } else if (e.kind() == ITER_EVENT) {
                iterate(e.t, e.r);
            } else if (e.kind() == PULLED_EVENT) {
                pool_.pull_arrived(e.r, e.j, e.t);
                if (!iterating_[static_cast<size_t>(e.j)]) start_iterations(e.j, e.t);
            } else {
                network_event(e.t, e.r);
            }
        }
    }

    // ClusterSimulator._start_iterations: prefill instance k's next iteration, no earlier than t, if a
    // queued prompt is (known to be) ready by then or later
    void start_iterations(int64_t k, double t) {
        const double s = pool_.next_start(k);
        if (s < std::numeric_limits<double>::infinity()) {
            iterating_[static_cast<size_t>(k)] = 1;
            push(s > t ? s : t, ITER_EVENT, k);
        } else {
            iterating_[static_cast<size_t>(k)] = 0;
        }
    }

    // ClusterSimulator._iterate: prefill instance k's iteration starts at t; the prompts it ends get
    // their prefill end (TTFT) at its end
    void iterate(double t, int64_t k) {
        const size_t kk = static_cast<size_t>(k);
        if (pool_.next_start(k) > t) {  // nothing ready now (a pull still on its way)
            iterating_[kk] = 0;
            start_iterations(k, t);
            return;
        }
        const double end = pool_.form(k, t);
        std::vector<std::pair<int64_t, double>>& ends = pool_.prefill_ends();
        std::vector<std::pair<double, int64_t>>& fifo = fifo_[kk];
        for (const auto& [r, e] : ends) {
            const size_t q = static_cast<size_t>(r);
            ttft_s_[q] = e - trace_.arrival_s[q];
            // the estimate at dispatch replaced by the end (list.remove, then bisect.insort)
            fifo.erase(std::find(fifo.begin(), fifo.end(), std::make_pair(prefill_end_s_[q], r)));
            const std::pair<double, int64_t> x{e, r};
            size_t lo = 0, hi = fifo.size();
            while (lo < hi) {
                const size_t mid = (lo + hi) / 2;
                if (x < fifo[mid]) hi = mid;
                else lo = mid + 1;
            }
            fifo.insert(fifo.begin() + static_cast<std::ptrdiff_t>(lo), x);
            prefill_end_s_[q] = e;
            push(e, PREFILL_DONE_EVENT, r);
        }
        ends.clear();
        if (pool_.waiting(k)) push(end, ITER_EVENT, k);
        else iterating_[kk] = 0;
    }

    // ClusterSimulator._schedule_network: an event at the network's next drain (one pending, by version)
    void schedule_network() {
        if (network_.next_s() < std::numeric_limits<double>::infinity() && network_.version() != net_version_) {
            net_version_ = network_.version();
            push(network_.next_s(), NET_EVENT, network_.version());
        }
    }

    // ClusterSimulator._network_event: transfers drained at t; a pull arrives a transfer latency later
    void network_event(double t, int64_t version) {
        if (version != network_.version()) return;  // rates changed since: a later event stands
        network_.drained(t, drained_);
        for (const Network::Payload& p : drained_)
            push(p.kind == PULLED_EVENT ? t + s_.pull_latency_s : t, p.kind, p.a, p.b);
        schedule_network();
    }

    // ClusterSimulator._release and _ended: request r's decode ends at t
    void release(double t, int64_t r) {
        const size_t q = static_cast<size_t>(r);
        const size_t j = static_cast<size_t>(decode_instance_[q]);
        used_[j] -= footprint_[q];
        batch_[j] -= 1;
        in_decode_ -= 1;
        end_s_[q] = t;
        outcome_[q] = COMPLETED;
        completed_ += 1;
        completions_.push_back(r);
        if (ttft_s_[q] <= s_.ttft_slo_s) completed_in_ttft_slo_ += 1;
        tbt_s_[q] = max_interval_s_[q] = mean_interval_s_[q] = s_.tbt_s;
    }

    // ClusterSimulator._prefill_done under the reserve model (no KV transfer)
    void prefill_done(double t, int64_t r) {
        const size_t q = static_cast<size_t>(r);
        in_prefill_ -= 1;
        if (s_.prefill_batching) {  // an instance's prompts may end out of their arrival order
            std::vector<std::pair<double, int64_t>>& fifo = fifo_[static_cast<size_t>(prefill_instance_[q])];
            if (fifo.front().second == r) fifo.erase(fifo.begin());
            else fifo.erase(std::find(fifo.begin(), fifo.end(), std::make_pair(t, r)));
        }
        const int64_t tokens = footprint_[q];
        int64_t target = target_[q];
        target_[q] = -1;
        if (s_.batching) {
            prefill_done_batching(t, r, tokens, target);
            return;
        }
        if (target < 0) {  // the lecture's rule: the instance with the most free room (the first)
            target = 0;
            int64_t best_used = used_[0];
            for (size_t j = 1; j < used_.size(); ++j)
                if (used_[j] < best_used) {
                    target = static_cast<int64_t>(j);
                    best_used = used_[j];
                }
        }
        if (!(used_[static_cast<size_t>(target)] + tokens <= s_.capacity_tokens)) {
            reject_after_prefill(t, q);
            return;
        }
        decode_instance_[q] = target;
        // ClusterSimulator._join: its end is known now
        in_decode_ += 1;
        decode_start_s_[q] = t;
        granted_ += 1;
        if (ttft_s_[q] <= s_.ttft_slo_s) granted_in_ttft_slo_ += 1;
        const size_t j = static_cast<size_t>(target);
        used_[j] += tokens;
        batch_[j] += 1;
        push(t + static_cast<double>(output_[q]) * s_.tbt_s, DECODE_EVENT, r);
    }

    void reject_after_prefill(double t, size_t q) {
        outcome_[q] = REJECTED_AFTER_PREFILL;
        rejected_after_prefill_ += 1;
        const double w = prefill_s_[q];
        wasted_prefill_s_ += w;
        wasted_t_.push_back(t);
        wasted_s_.push_back(w);
    }

    void schedule(const BatchingDecode& d) {
        if (d.next_event_s() < std::numeric_limits<double>::infinity())
            push(d.next_event_s(), DECODE_EVENT, d_index(d), d.version());
    }
    int64_t d_index(const BatchingDecode& d) const { return static_cast<int64_t>(&d - decoders_.data()); }

    // ClusterSimulator._prefill_done under batching: the fastest accepting instance (or the action's, if it
    // accepts), then the KV copy's tail before the request joins
    void prefill_done_batching(double t, int64_t r, int64_t tokens, int64_t target) {
        const size_t q = static_cast<size_t>(r);
        if (target < 0)
            target = fastest_accepting(decoders_, tokens, t, s_.check_tbt, s_.decode.capacity_tokens,
                                       s_.decode.max_running, s_.decode.tbt_slo_s);
        else if (!decoders_[static_cast<size_t>(target)].accepts(tokens, t, s_.check_tbt))
            target = -1;
        if (target < 0) {
            reject_after_prefill(t, q);
            return;
        }
        decode_instance_[q] = target;
        if (s_.kv_transfer) {
            decoders_[static_cast<size_t>(target)].reserve(tokens);
            reserved_[q] = tokens;
            const double tail = transfer_tail_s(tokens, prefill_s_[q]);
            if (s_.shared_nics) {  // the tail (its latency's share included) as bytes sharing the two nodes' NICs
                network_.add(t, prefill_instance_[q], s_.n_prefill + target, tail * network_.bandwidth(),
                             Network::Payload{JOIN_EVENT, r, target});
                schedule_network();
            } else {
                push(t + tail, JOIN_EVENT, r, target);
            }
        } else {
            join(r, target, t);
        }
    }

    // ClusterSimulator._transfer_tail_s: the last layer's share of the copy, plus what outlasts the prefill
    double transfer_tail_s(int64_t tokens, double prefill_s) const {
        const double copy = tokens <= 0 ? 0.0
                                        : static_cast<double>(tokens * s_.kv_bytes_per_token) / s_.rdma_bandwidth +
                                              s_.transfer_latency_s;
        return (copy > prefill_s ? copy - prefill_s : 0.0) + copy / static_cast<double>(s_.n_layers);
    }

    // ClusterSimulator._join under batching: request r's KV is on decode instance j at t
    void join(int64_t r, int64_t j, double t) {
        const size_t q = static_cast<size_t>(r);
        in_decode_ += 1;
        decode_start_s_[q] = t;
        granted_ += 1;
        const double ttft = ttft_s_[q];
        if (ttft <= s_.ttft_slo_s) granted_in_ttft_slo_ += 1;
        BatchingDecode& d = decoders_[static_cast<size_t>(j)];
        const int64_t reserved = reserved_[q];
        reserved_[q] = 0;
        ended_.clear();
        d.join(r, t, footprint_[q], output_[q], trace_.arrival_s[q] + ttft, reserved, ended_);
        if (!ended_.empty()) ended(ended_);
        schedule(d);
    }

    // ClusterSimulator._ended
    void ended(const std::vector<Completion>& completions) {
        for (const Completion& c : completions) {
            const size_t q = static_cast<size_t>(c.r);
            in_decode_ -= 1;
            end_s_[q] = c.end_s;
            if (c.preempted) {
                outcome_[q] = PREEMPTED;
                preempted_ += 1;
                wasted_prefill_s_ += prefill_s_[q];
                continue;
            }
            outcome_[q] = COMPLETED;
            completed_ += 1;
            completions_.push_back(c.r);
            if (ttft_s_[q] <= s_.ttft_slo_s) completed_in_ttft_slo_ += 1;
            if (!std::isnan(c.tbt)) tbt_s_[q] = max_interval_s_[q] = mean_interval_s_[q] = c.tbt;
        }
    }

    // ClusterSimulator._sample_until
    void sample_until(double t) {
        double s = next_sample_;
        const double horizon = horizon_;
        if (s >= t || s > horizon) return;
        const std::vector<double>& busy_until = pool_.busy_until();
        const double n_p = static_cast<double>(busy_until.size());
        const double n_d = static_cast<double>(used_.size());
        const double cap = static_cast<double>(s_.capacity_tokens * s_.n_decode);
        const double per_instance = static_cast<double>(s_.capacity_tokens);
        while (s < t && s <= horizon) {
            if (s_.batching) {  // each instance's (batch, used, step) at s
                loads_.clear();
                for (const BatchingDecode& d : decoders_) loads_.push_back(d.load(s, 0));
            }
            int64_t total = 0;
            if (s_.batching)
                for (const BatchingDecode::Load& l : loads_) total += l.used;
            else
                for (int64_t u : used_) total += u;
            const double kv = static_cast<double>(total) / cap;
            samples_t_.push_back(s);
            if (s_.lecture_loads) {  // the share of prefill instances busy, the decode KV use
                int64_t busy = 0;
                for (double b : busy_until)
                    if (b > s) busy += 1;
                samples_p_.push_back(static_cast<double>(busy) / n_p);
                samples_d_.push_back(kv);
            } else {  // Mooncake §7's loads as SLO satisfaction
                terms_.clear();
                for (double b : busy_until)
                    if (b > s) terms_.push_back(b - s);
                const double queued = py_sum(terms_.data(), terms_.size(), s_.compensated_sum);
                samples_p_.push_back(queued / (n_p * s_.ttft_slo_s));
                terms_.clear();
                for (size_t j = 0; j < used_.size(); ++j) {
                    const double a = static_cast<double>(s_.batching ? loads_[j].used : used_[j]) / per_instance;
                    const double b = (s_.batching ? loads_[j].step : (batch_[j] ? s_.tbt_s : 0.0)) / s_.tbt_slo_s;
                    terms_.push_back(b > a ? b : a);
                }
                samples_d_.push_back(py_sum(terms_.data(), terms_.size(), s_.compensated_sum) / n_d);
            }
            samples_kv_.push_back(kv);
            k_sample_ += 1;
            s = static_cast<double>(k_sample_) * s_.sample_period_s;
        }
        next_sample_ = s <= horizon ? s : std::numeric_limits<double>::infinity();
    }

  public:
    // --- snapshots (docs/engine.md "Snapshots") ------------------------------------------------------
    // A copy of the whole state, for restore(): the prefill pool's (RoutingEngine::snapshot), the
    // events, the decode instances, the NICs, the counters, the series, the default router's generator
    // and the per-request records. A request's record is written only once it has arrived (index()), so
    // the records of the requests from index() on hold their initial values and only the ones before are
    // copied. The trace and the settings are shared.
    struct Snapshot {
        const Cluster* owner = nullptr;
        std::unique_ptr<RoutingEngine> pool;
        std::vector<int64_t> target_, reserved_, prefill_instance_, decode_instance_;
        std::vector<int8_t> outcome_;
        std::vector<double> ttft_s_, prefill_s_, decode_start_s_, end_s_, tbt_s_, prefill_end_s_, max_interval_s_,
            mean_interval_s_;
        ClusterState state;
    };

    std::unique_ptr<Snapshot> snapshot() const {
        auto s = std::make_unique<Snapshot>();
        s->owner = this;
        s->pool = pool_.snapshot();
        s->state = static_cast<const ClusterState&>(*this);
        const size_t k = static_cast<size_t>(i_);
        for_records(*s, *this, [k](auto& to, const auto& from, auto) { to.assign(from.begin(), from.begin() + k); });
        return s;
    }

    // Back to the state of `s`, a snapshot of this cluster (it stays valid for more restores).
    void restore(const Snapshot& s) {
        if (s.owner != this) throw std::invalid_argument("restore: a snapshot of another cluster");
        pool_.restore(*s.pool);
        const size_t k = static_cast<size_t>(s.state.i_), now = static_cast<size_t>(i_);
        // the snapshot's records, and the initial values from there to the requests this run has reached
        for_records(*this, s, [k, now](auto& to, const auto& from, auto init) {
            std::copy(from.begin(), from.end(), to.begin());
            if (now > k) std::fill(to.begin() + static_cast<std::ptrdiff_t>(k), to.begin() + static_cast<std::ptrdiff_t>(now), init);
        });
        static_cast<ClusterState&>(*this) = s.state;
    }

  private:
    // f(to's record, from's record, its initial value) for every per-request record
    template <class To, class From, class F>
    static void for_records(To& to, const From& from, F f) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        f(to.target_, from.target_, int64_t(-1));
        f(to.reserved_, from.reserved_, int64_t(0));
        f(to.prefill_instance_, from.prefill_instance_, int64_t(-1));
        f(to.decode_instance_, from.decode_instance_, int64_t(-1));
        f(to.outcome_, from.outcome_, static_cast<int8_t>(PENDING));
        for (auto [t, s] : {std::make_pair(&to.ttft_s_, &from.ttft_s_), std::make_pair(&to.prefill_s_, &from.prefill_s_),
                            std::make_pair(&to.decode_start_s_, &from.decode_start_s_),
                            std::make_pair(&to.end_s_, &from.end_s_), std::make_pair(&to.tbt_s_, &from.tbt_s_),
                            std::make_pair(&to.prefill_end_s_, &from.prefill_end_s_),
                            std::make_pair(&to.max_interval_s_, &from.max_interval_s_),
                            std::make_pair(&to.mean_interval_s_, &from.mean_interval_s_)})
            f(*t, *s, nan);
    }

};

}  // namespace mooncake
