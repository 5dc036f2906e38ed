// OverloadAdmission-v0 on the native engine (docs/engine.md "OverloadAdmission-v0 on the engine"): the
// lecture's admission problem (mooncake_gym/sim/admission.py LectureAdmission: the recent rejection and
// waste window, the least-queued prefill instance, the predicted TTFT) over cluster.hpp's Cluster under the
// `lecture` preset, the reserve model's two decode-token projections (sim/cluster.py
// ClusterSimulator.decode_token_projections) and the environment's step (mooncake_gym/envs/
// overload_admission.py OverloadAdmissionEnv: the doomed-prefill charge, the reward, the info row and the
// observation). Every formula follows the reference operation for operation, in its order, so that the
// observations (rounded to float32 as the reference's packing does), rewards and infos are the
// reference's to the bit (tests/test_engine_admission.py).
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

#include "batch.hpp"
#include "cluster.hpp"

namespace mooncake {

// What OverloadAdmissionEnv and LectureAdmission compute once per env or episode.
struct AdmissionSpec {
    int64_t pool_capacity_tokens = 1;  // OverloadConfig.decode_pool_capacity_tokens
    int64_t capacity_tokens = 1;       // per decode instance (decode_capacity_tokens)
    double ttft_slo_s = 30.0, recent_window_s = 30.0, tbt_s = 0.05;
    bool oracle = false;
    double mean_output_tokens = 0.0;   // LectureAdmission.mean_output_tokens (the view's, feature 5)
    double mean_decode_s = 0.0;        // LectureAdmission.mean_decode_s (the projections' decode time)
    double projection_output_tokens = 0.0;  // the cluster's mean_output_tokens (a request in prefill's output)
    // the observation's denominators (OverloadAdmissionEnv._denominators) and caps
    double ttft_den = 45.0, rejected_den = 1.0, wasted_den = 240.0, in_prefill_den = 160.0;
    double log1p_input_cap = 1.0, output_cap = 4096.0;
    double waste_penalty = 0.1, mean_prefill_s = 1.0;  // the reward's
};

// index, admitted, granted, doomed_s, wasted_s, completed, rejected_at_arrival, rejected_after_prefill:
// OverloadAdmissionEnv.step's info, in its order
constexpr int ADMISSION_INFO_FIELDS = 8;

class AdmissionEnv : public SteppableEnv {
  public:
    // `prefill`: the prefill time of the pool's instances (the first's: LectureAdmission's prefill_s is
    // RoutingSimulator.uncached_prefill_s(0)); `survival`: P(output > k) over the workload
    // (ClusterSimulator._survival_table).
    AdmissionEnv(Cluster& cluster, AdmissionSpec spec, const PrefillTime& prefill, std::vector<double> survival)
        : c_(cluster), spec_(spec), surv_(std::move(survival)) {
        const int64_t n = static_cast<int64_t>(c_.outcome().size());
        prefill_s_.resize(static_cast<size_t>(n));  // each request's, without a prefix hit
        for (int64_t r = 0; r < n; ++r) prefill_s_[static_cast<size_t>(r)] = prefill(c_.pool().input_tokens(r), 0);
        n_prefill_ = c_.pool().n_instances();
        queue_.resize(static_cast<size_t>(n_prefill_));
        start();
    }

    int64_t n_obs() const { return spec_.oracle ? 12 : 11; }
    int64_t n_actions() const override { return 2; }
    bool done() const override { return c_.done(); }

    // The episode from the cluster's state as it is (just reset): LectureAdmission.reset's fresh window,
    // the env's running counters, the pending view and observation.
    void start() {
        rej_.clear();
        waste_.clear();
        waste_sum_ = 0.0;
        seen_waste_ = 0;
        granted_ = 0;
        wasted_ = 0.0;
        doomed_ = {};
        rebuild();
        if (!c_.done()) make_view();
        observe();
    }

    double step(int64_t action, bool& terminated) override { return act(action == 1, terminated); }

    // OverloadAdmissionEnv.step on the pending request (LectureAdmission.step inside), with the info row.
    double act(bool admit, bool& terminated) {
        const int64_t index = i_;
        double doomed = 0.0;
        if (admit && ttft_ > spec_.ttft_slo_s) {  // certain to miss the SLO: its prefill charged now
            doomed = ps_;
            doomed_.emplace(finish_, index, doomed);
        }
        if (admit) {  // to the least-queued instance the view shows
            c_.apply(true, best_, false, -1);
            fifo_[static_cast<size_t>(best_)].push_back(index);
        } else {
            rej_.push_back(now_);
            c_.apply(false, -1, false, -1);
        }
        const bool over = c_.done();
        if (!over) make_view();
        const std::vector<int64_t> n = c_.counters();
        const int64_t granted = n[7] - granted_;
        double wasted = c_.wasted_prefill_s() - wasted_;
        granted_ = n[7];
        wasted_ = c_.wasted_prefill_s();
        if (!doomed_.empty()) {  // a doomed request rejected after prefill was charged already
            const double settled = over ? std::numeric_limits<double>::infinity() : now_;
            const std::vector<int8_t>& outcome = c_.outcome();
            while (!doomed_.empty() && std::get<0>(doomed_.top()) <= settled) {
                const auto [f, r, prefill] = doomed_.top();
                doomed_.pop();
                if (outcome[static_cast<size_t>(r)] == REJECTED_AFTER_PREFILL) wasted -= prefill;
            }
        }
        if (wasted < 1e-9) wasted = 0.0;
        const double reward =
            static_cast<double>(granted) - spec_.waste_penalty * (doomed + wasted) / spec_.mean_prefill_s;
        if (info) {
            const double row[ADMISSION_INFO_FIELDS] = {static_cast<double>(index), admit ? 1.0 : 0.0,
                                                       static_cast<double>(granted), doomed, wasted,
                                                       static_cast<double>(n[6]), static_cast<double>(n[3]),
                                                       static_cast<double>(n[4])};
            std::copy(row, row + ADMISSION_INFO_FIELDS, info);
        }
        terminated = over;
        observe();
        return reward;
    }

    // OverloadAdmissionEnv._observe: the pending request's features, clipped, as float32 (zeros after the last).
    void observe() {
        if (!obs) return;
        const size_t n_obs_ = static_cast<size_t>(n_obs());
        if (c_.done()) {
            std::fill(obs, obs + n_obs_, 0.0f);
            return;
        }
        const auto [uniform, expected] = projections(finish_, spec_.mean_decode_s);
        const double cap = static_cast<double>(spec_.pool_capacity_tokens);
        const double per = static_cast<double>(spec_.capacity_tokens);
        const std::vector<int64_t>& used = c_.used();
        int64_t total = 0, least = used[0];
        for (int64_t u : used) {
            total += u;
            if (u < least) least = u;
        }
        const int64_t input = c_.pool().input_tokens(i_);
        float* out = obs;
        *out++ = clip(static_cast<double>(total) / cap);
        *out++ = clip(uniform / cap);
        *out++ = clip(expected / cap);
        *out++ = clip(ttft_ / spec_.ttft_den);
        *out++ = clip(static_cast<double>(spec_.capacity_tokens - least) / per);
        *out++ = clip((static_cast<double>(input) + spec_.mean_output_tokens) / per);
        *out++ = clip(std::log1p(static_cast<double>(input)) / spec_.log1p_input_cap);
        *out++ = clip(static_cast<double>(rej_.size()) / spec_.rejected_den);
        *out++ = clip(waste_sum_ / spec_.wasted_den);
        *out++ = clip(static_cast<double>(c_.counters()[8]) / spec_.in_prefill_den);
        *out++ = ttft_ > spec_.ttft_slo_s ? 1.0f : 0.0f;
        if (spec_.oracle)
            *out++ = clip(static_cast<double>(c_.output_tokens()[static_cast<size_t>(i_)]) / spec_.output_cap);
    }

    // ClusterSimulator.decode_token_projections(at_s, decode_s) under the reserve model: (every request
    // decoding decode_s seconds, the expectation under the workload's decode-time distribution).
    std::pair<double, double> projections(double at_s, double decode_s) {
        sync();
        const double td = decode_s, out = spec_.projection_output_tokens, now = c_.now();
        const size_t n_s = surv_.size();
        const double inv_tbt = 1.0 / spec_.tbt_s;
        const std::vector<double>& start_s = c_.decode_start_s();
        const std::vector<int64_t>& output = c_.output_tokens();
        const RoutingEngine& pool = c_.pool();
        double uniform = 0.0, expected = 0.0;
        for (int64_t r : decode_) {
            const size_t q = static_cast<size_t>(r);
            const double start = start_s[q];
            const double tokens = static_cast<double>(pool.input_tokens(r) + output[q]);
            if (start + td > at_s) uniform += tokens;
            const int64_t k_now = static_cast<int64_t>((now - start) * inv_tbt);
            const double s_now = k_now < static_cast<int64_t>(n_s) ? surv_[static_cast<size_t>(k_now)] : 0.0;
            if (s_now <= 0.0) {  // has outlived every decode in the statistics: it is still here
                expected += tokens;
                continue;
            }
            const int64_t k_at = static_cast<int64_t>((at_s - start) * inv_tbt);
            if (k_at < 0) {
                expected += tokens;
            } else if (k_at < static_cast<int64_t>(n_s)) {
                const double s_at = surv_[static_cast<size_t>(k_at)];
                expected += s_at < s_now ? tokens * (s_at / s_now) : tokens;
            }
        }
        const std::vector<double>& end_s = c_.prefill_end_s();
        for (const std::vector<int64_t>& fifo : fifo_) {
            for (int64_t r : fifo) {
                const double finish = end_s[static_cast<size_t>(r)];
                if (finish > at_s) break;
                const double need = static_cast<double>(pool.input_tokens(r)) + out;
                if (finish + td > at_s) uniform += need;
                const int64_t k = static_cast<int64_t>((at_s - finish) * inv_tbt);
                if (k < static_cast<int64_t>(n_s)) expected += need * surv_[static_cast<size_t>(k)];
            }
        }
        return {uniform, expected};
    }

    // Each request's prefill time on any instance (LectureAdmission's prefill_s).
    const std::vector<double>& prefill_times() const { return prefill_s_; }

    // The pending view's fields of LectureAdmission._view (the rest are the episode's constants).
    int64_t index() const { return i_; }
    double now() const { return now_; }
    const std::vector<double>& queue_s() const { return queue_; }
    int64_t prefill_instance() const { return best_; }
    double prefill_s() const { return ps_; }
    double finish() const { return finish_; }
    double predicted_ttft_s() const { return ttft_; }
    int64_t recent_rejected() const { return static_cast<int64_t>(rej_.size()); }
    int64_t recent_rejected_after_prefill() const { return static_cast<int64_t>(waste_.size()); }
    double recent_wasted_s() const { return waste_sum_; }

  private:
    using Doomed = std::tuple<double, int64_t, double>;  // (prefill finish, request, prefill s): heapq's order
    Cluster& c_;
    AdmissionSpec spec_;
    std::vector<double> prefill_s_, surv_;
    int64_t n_prefill_ = 0;
    // the pending view
    int64_t i_ = 0, best_ = 0;
    double now_ = 0.0, ps_ = 0.0, finish_ = 0.0, ttft_ = 0.0;
    std::vector<double> queue_;
    // LectureAdmission's recent window
    std::deque<double> rej_;
    std::deque<std::pair<double, double>> waste_;
    double waste_sum_ = 0.0;
    size_t seen_waste_ = 0;
    // the env's running values
    int64_t granted_ = 0;
    double wasted_ = 0.0;
    std::priority_queue<Doomed, std::vector<Doomed>, std::greater<Doomed>> doomed_;
    // the requests the projections walk: in decode in the order they joined (ClusterSimulator._decode_of's),
    // and per prefill instance its requests in prefill in FIFO order (_prefill_fifo's); kept as of the
    // last sync(), with the admissions since appended to their instance's FIFO
    std::vector<int64_t> decode_, joined_;
    std::vector<std::vector<int64_t>> fifo_;

    static float clip(double x) { return static_cast<float>(x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x)); }

    // The lists from the cluster's records (at the start).
    void rebuild() {
        decode_.clear();
        fifo_.assign(static_cast<size_t>(n_prefill_), {});
        const std::vector<int8_t>& outcome = c_.outcome();
        const std::vector<double>& start = c_.decode_start_s();
        const std::vector<int64_t>& instance = c_.prefill_instance();
        for (int64_t r = 0; r < c_.index(); ++r) {
            const size_t q = static_cast<size_t>(r);
            if (outcome[q] != PENDING || instance[q] < 0) continue;
            if (std::isnan(start[q])) fifo_[static_cast<size_t>(instance[q])].push_back(r);
            else decode_.push_back(r);
        }
        order(decode_);
    }

    // in the order of their joins: the time, then the order of their prefills' ends (of their admissions)
    void order(std::vector<int64_t>& rs) const {
        const std::vector<double>& start = c_.decode_start_s();
        std::stable_sort(rs.begin(), rs.end(), [&start](int64_t a, int64_t b) {
            return start[static_cast<size_t>(a)] < start[static_cast<size_t>(b)];
        });
    }

    // The requests whose prefill ended since the last call out of the FIFOs (those now decoding appended
    // to decode_ in their joins' order), and those that finished decoding out of decode_.
    void sync() {
        const std::vector<int8_t>& outcome = c_.outcome();
        const std::vector<double>& start = c_.decode_start_s();
        joined_.clear();
        for (std::vector<int64_t>& fifo : fifo_) {
            size_t k = 0;
            for (int64_t r : fifo) {
                const size_t q = static_cast<size_t>(r);
                if (outcome[q] == PENDING && std::isnan(start[q])) fifo[k++] = r;  // still in prefill
                else if (outcome[q] == PENDING) joined_.push_back(r);
            }
            fifo.resize(k);
        }
        size_t k = 0;
        for (int64_t r : decode_)
            if (outcome[static_cast<size_t>(r)] == PENDING) decode_[k++] = r;
        decode_.resize(k);
        if (!joined_.empty()) {
            std::sort(joined_.begin(), joined_.end());  // (request order, then stably by join time)
            order(joined_);
            decode_.insert(decode_.end(), joined_.begin(), joined_.end());
        }
    }

    // LectureAdmission._view: the pending request's queues, least-queued instance and predicted finish,
    // and the recent window moved on to its arrival.
    void make_view() {
        view_fields();
        const std::vector<double>& log_t = c_.wasted_t();
        const std::vector<double>& log_s = c_.wasted_s();
        for (; seen_waste_ < log_t.size(); ++seen_waste_) {
            const double t = log_t[seen_waste_], w = log_s[seen_waste_];
            rej_.push_back(t);
            waste_.emplace_back(t, w);
            waste_sum_ += w;
        }
        const double cutoff = now_ - spec_.recent_window_s;
        while (!rej_.empty() && rej_.front() < cutoff) rej_.pop_front();
        while (!waste_.empty() && waste_.front().first < cutoff) {
            waste_sum_ -= waste_.front().second;
            waste_.pop_front();
        }
        if (waste_.empty()) waste_sum_ = 0.0;
    }

    // the view's fields that read the cluster alone (not the window)
    void view_fields() {
        i_ = c_.index();
        now_ = c_.now();
        const std::vector<double>& busy = c_.pool().busy_until();
        best_ = 0;
        double best_q = std::numeric_limits<double>::infinity();
        for (size_t k = 0; k < busy.size(); ++k) {
            double q = busy[k] - now_;
            if (q < 0.0) q = 0.0;
            queue_[k] = q;
            if (q < best_q) {
                best_ = static_cast<int64_t>(k);
                best_q = q;
            }
        }
        ps_ = prefill_s_[static_cast<size_t>(i_)];
        finish_ = now_ + best_q + ps_;
        ttft_ = finish_ - now_;
    }
};

}  // namespace mooncake
