// The realistic presets' prefill mechanisms on the native engine: chunked prefill batching per
// iteration up to a token budget, with chunked pipeline parallelism over groups of instances
// (mooncake_gym/sim/prefill.py PrefillEngine), and KV transfers sharing the nodes' NICs
// (mooncake_gym/sim/network.py Network).
//
// Every formula follows its Python reference operation for operation, in the same order, so that the
// results are the same doubles (tests/test_engine_batching.py compares them decision by decision).
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

namespace mooncake {

// A prompt in a PrefillBatcher's queue (PrefillJob): request r, tokens pos..n still to compute,
// computable from ready_s on, extra_s of per-request time in the iteration of its last chunk, est_s
// its remaining time served alone.
struct PrefillJob {
    int64_t r, n, pos;
    double ready_s, extra_s, est_s;
    int64_t tokens;   // computed tokens in all
    bool pipelined;   // prefilled by chunked pipeline parallelism over the batcher's group
};

// The instance's totals that the batcher changes (PrefillInstance's attributes): references into the
// routing engine's per-instance arrays.
struct InstanceTotals {
    double& busy_until;
    double& busy_s;
    int64_t& queued_tokens;
    int64_t& requests;
};

// PrefillEngine on one prefill instance: each iteration takes up to `budget` new tokens from the queue in
// arrival order (a prompt whose pull has not arrived is passed over), and a prompt of at least
// `pipeline_min_tokens` computed tokens is pipelined over the instance's group (`group`: the indices of
// the group's batchers, this one first; see form_pipeline); see sim/prefill.py for the model. `Time` is
// the instance's PrefillTime (engine.hpp).
template <typename Time>
struct PrefillBatcher {
    int64_t budget = 0;
    Time timing;
    double time = 0.0;  // the end of the last formed iteration
    std::deque<PrefillJob> jobs;
    int64_t waiting = 0;
    double est_s = 0.0;
    std::vector<std::pair<int64_t, double>> ended;    // (request, first token time) since last collected
    std::deque<std::pair<double, int64_t>> ends;      // (first token time, tokens) of ended prompts
    int64_t iterations = 0;
    // chunked pipeline parallelism (PrefillEngine.set_pipeline): none while group holds one batcher
    std::vector<int64_t> group;
    int64_t pipeline_min_tokens = 0;
    double send_s_per_token = 0.0, send_latency_s = 0.0, stage_overhead_s = 0.0;
    double blocked_until = 0.0;  // a pipelined prompt of the group holds this instance until then
    int64_t pipelined_runs = 0;

    // PrefillEngine.add
    void add(InstanceTotals inst, int64_t r, double now, double ready_s, int64_t n, int64_t h, double est) {
        const double extra = est - timing.chunked_compute(n, h);
        const bool pipelined = group.size() > 1 && n - h >= pipeline_min_tokens;
        jobs.push_back(PrefillJob{r, n, h, ready_s, extra > 0.0 ? extra : 0.0, est, n - h, pipelined});
        waiting += 1;
        est_s += est;
        inst.queued_tokens += n - h;
        inst.requests += 1;
        const double start = time > now ? time : now;
        inst.busy_until = start + est_s;
    }

    // PrefillEngine.queued_requests: prompts queued or in an iteration at now (those ended forgotten)
    int64_t queued_requests(double now, int64_t& queued_tokens) {
        while (!ends.empty() && ends.front().first <= now) {
            queued_tokens -= ends.front().second;
            ends.pop_front();
        }
        return waiting + static_cast<int64_t>(ends.size());
    }

    // PrefillEngine.next_start
    double next_start() const {
        const double s = time > blocked_until ? time : blocked_until;
        double first = std::numeric_limits<double>::infinity();
        for (const PrefillJob& job : jobs)
            if (job.pos < job.n) {
                if (job.ready_s <= s) return s;
                if (job.ready_s < first) first = job.ready_s;
            }
        return first > s ? first : s;
    }

    // PrefillEngine.form: the iteration starting at s; returns its end (a pipeline: when this instance
    // is free again). A pipelined prompt's turn is the caller's (`pipelined` set to it, -1 returned):
    // form_pipeline, which needs the group's batchers.
    double form(InstanceTotals inst, double s, PrefillJob** pipelined = nullptr) {
        int64_t left = budget;
        double compute = 0.0, attention = 0.0, extra = 0.0;
        int64_t tokens = 0;
        done_.clear();
        for (PrefillJob& job : jobs) {
            if (job.pos >= job.n || job.ready_s > s) continue;
            if (job.pipelined) {
                if (tokens) break;  // its turn comes next, alone
                *pipelined = &job;
                return -1.0;
            }
            int64_t take = job.n - job.pos;
            if (take > left) take = left;
            const int64_t e = job.pos + take;
            compute += timing.chunk_compute_s(job.pos, e);
            attention += timing.chunk_attention_s(job.pos, e);
            tokens += take;
            left -= take;
            if (e == job.n) {
                extra += job.extra_s;
                done_.push_back(&job);
                est_s -= job.est_s;
            } else {  // a chunk: its remaining time served alone from here
                const double rest = timing.chunked_compute(job.n, e) + job.extra_s;
                est_s += rest - job.est_s;
                job.est_s = rest;
            }
            job.pos = e;
            if (left == 0) break;
        }
        const double dur = timing.iteration_s(compute, tokens, attention) + extra;
        const double end = s + dur;
        time = end;
        iterations += 1;
        inst.busy_s += dur;
        for (const PrefillJob* job : done_) {
            ended.emplace_back(job->r, end);
            ends.emplace_back(end, job->tokens);
        }
        waiting -= static_cast<int64_t>(done_.size());
        done_.clear();  // (pointers into jobs: cleared before the head is popped)
        while (!jobs.empty() && jobs.front().pos >= jobs.front().n) jobs.pop_front();
        if (!waiting) est_s = 0.0;
        inst.busy_until = waiting ? end + est_s : end;
        return end;
    }

    // PrefillEngine.ready: request r's pull arrived at t
    bool ready(int64_t r, double t) {
        for (PrefillJob& job : jobs)
            if (job.r == r && job.pos < job.n) {
                job.ready_s = t;
                return true;
            }
        return false;
    }

    // PrefillEngine._pipeline: `job`'s chunks of at most `budget` tokens through the group's stages (this
    // batcher stage 0, `mates[k]` stage k with its instance's totals `mate_totals[k]`), from when every
    // instance of the group is free; returns when this instance is free again.
    double form_pipeline(InstanceTotals inst, PrefillJob& job, double s, const std::vector<PrefillBatcher*>& mates,
                         const std::vector<InstanceTotals*>& mate_totals) {
        double start = s;
        for (const PrefillBatcher* mate : mates)
            if (mate->time > start) start = mate->time;
        const size_t p_stages = mates.size();
        const double ovh = stage_overhead_s;
        std::vector<double> finish(p_stages, start);
        double busy = 0.0;
        int64_t pos = job.pos;
        while (pos < job.n) {
            int64_t e = pos + budget;
            if (e > job.n) e = job.n;
            const int64_t t = e - pos;
            const double stage =
                (timing.iteration_s(timing.chunk_compute_s(pos, e), t, timing.chunk_attention_s(pos, e)) - ovh) /
                    static_cast<double>(p_stages) + ovh;
            const double send = send_latency_s + send_s_per_token * static_cast<double>(t);
            double ready = start;  // the chunk enters stage 0 at once
            for (size_t k = 0; k < p_stages; ++k) {
                const double begin = ready > finish[k] ? ready : finish[k];
                finish[k] = begin + stage;
                ready = finish[k] + send;
            }
            busy += stage;
            pos = e;
        }
        const double end = finish[p_stages - 1] + job.extra_s;
        job.pos = job.n;
        est_s -= job.est_s;
        for (size_t k = 1; k < p_stages; ++k) {
            PrefillBatcher& mate = *mates[k];
            const double free = finish[k];
            if (free > mate.blocked_until) mate.blocked_until = free;
            mate_totals[k]->busy_s += busy;
            mate_totals[k]->busy_until = mate.waiting ? free + mate.est_s : free;
        }
        const double free = finish[0];
        time = free;
        iterations += 1;
        pipelined_runs += 1;
        inst.busy_s += busy + job.extra_s;
        ended.emplace_back(job.r, end);
        ends.emplace_back(end, job.tokens);
        waiting -= 1;
        while (!jobs.empty() && jobs.front().pos >= jobs.front().n) jobs.pop_front();
        if (!waiting) est_s = 0.0;
        inst.busy_until = waiting ? free + est_s : end;
        return free;
    }

    PrefillBatcher() = default;
    PrefillBatcher(int64_t b, const Time& t) : budget(b), timing(t) {}
    PrefillBatcher(const PrefillBatcher& o)
        : budget(o.budget), timing(o.timing), time(o.time), jobs(o.jobs), waiting(o.waiting), est_s(o.est_s),
          ended(o.ended), ends(o.ends), iterations(o.iterations), group(o.group),
          pipeline_min_tokens(o.pipeline_min_tokens), send_s_per_token(o.send_s_per_token),
          send_latency_s(o.send_latency_s), stage_overhead_s(o.stage_overhead_s), blocked_until(o.blocked_until),
          pipelined_runs(o.pipelined_runs) {}
    PrefillBatcher& operator=(const PrefillBatcher& o) {
        budget = o.budget;
        timing = o.timing;
        time = o.time;
        jobs = o.jobs;
        waiting = o.waiting;
        est_s = o.est_s;
        ended = o.ended;
        ends = o.ends;
        iterations = o.iterations;
        group = o.group;
        pipeline_min_tokens = o.pipeline_min_tokens;
        send_s_per_token = o.send_s_per_token;
        send_latency_s = o.send_latency_s;
        stage_overhead_s = o.stage_overhead_s;
        blocked_until = o.blocked_until;
        pipelined_runs = o.pipelined_runs;
        done_.clear();
        return *this;
    }

  private:
    std::vector<PrefillJob*> done_;
};

// Network: the NICs of n nodes, `bandwidth` bytes/s each way; a transfer from a to b runs at
// bandwidth / max(transfers a sends, transfers b receives), recomputed whenever one starts or ends.
// A transfer's payload is (kind, a, b): what happens when it drains (the cluster's event).
class Network {
  public:
    struct Payload {
        int kind;
        int64_t a, b;
    };

    Network() = default;
    Network(int64_t n_nodes, double bandwidth)
        : bandwidth_(bandwidth), n_out_(static_cast<size_t>(n_nodes), 0), n_in_(static_cast<size_t>(n_nodes), 0) {}

    double bandwidth() const { return bandwidth_; }
    double next_s() const { return next_s_; }
    int64_t version() const { return version_; }
    double bytes_sent() const { return bytes_sent_; }
    int64_t transfers() const { return transfers_; }
    size_t active() const { return flows_.size(); }

    // Network.add
    void add(double t, int64_t sender, int64_t receiver, double nbytes, Payload payload) {
        progress(t);
        flows_.push_back(Flow{sender, receiver, nbytes, 0.0, 0.0, payload});
        n_out_[static_cast<size_t>(sender)] += 1;
        n_in_[static_cast<size_t>(receiver)] += 1;
        bytes_sent_ += nbytes;
        transfers_ += 1;
        rates();
    }

    // Network.drained: the payloads of the transfers done by t, in the order they started
    void drained(double t, std::vector<Payload>& done) {
        done.clear();
        for (const Flow& f : flows_)
            if (f.end <= t) {
                done.push_back(f.payload);
                n_out_[static_cast<size_t>(f.sender)] -= 1;
                n_in_[static_cast<size_t>(f.receiver)] -= 1;
            }
        if (done.empty()) return;
        progress(t);
        keep_.clear();
        for (const Flow& f : flows_)
            if (!(f.end <= t)) keep_.push_back(f);
        flows_.swap(keep_);
        rates();
    }

  private:
    struct Flow {
        int64_t sender, receiver;
        double left, rate, end;
        Payload payload;
    };
    double bandwidth_ = 1.0;
    std::vector<Flow> flows_, keep_;
    std::vector<int64_t> n_out_, n_in_;
    double t_ = 0.0;
    double next_s_ = std::numeric_limits<double>::infinity();
    int64_t version_ = 0;
    double bytes_sent_ = 0.0;
    int64_t transfers_ = 0;

    void progress(double t) {
        const double dt = t - t_;
        if (dt > 0.0)
            for (Flow& f : flows_) f.left -= f.rate * dt;
        t_ = t;
    }
    void rates() {
        double nxt = std::numeric_limits<double>::infinity();
        for (Flow& f : flows_) {
            const int64_t k = n_out_[static_cast<size_t>(f.sender)];
            const int64_t m = n_in_[static_cast<size_t>(f.receiver)];
            const double rate = bandwidth_ / static_cast<double>(k > m ? k : m);
            f.rate = rate;
            f.end = t_ + f.left / rate;
            if (f.end < nxt) nxt = f.end;
        }
        next_s_ = nxt;
        version_ += 1;
    }
};

}  // namespace mooncake
