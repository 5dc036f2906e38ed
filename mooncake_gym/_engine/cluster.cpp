// The binding of cluster.hpp (the cluster simulator: reserve or batching decode) into mooncake_gym._engine_native;
// module.cpp calls bind_cluster. The Python side that feeds it is mooncake_gym/_engine/cluster.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "cluster.hpp"
#include "clusterenv.hpp"
#include "fields.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using mooncake::Admission;
using mooncake::Pcg64;
using mooncake::Cluster;
using mooncake::Router;

namespace {

template <typename T>
T setting(const nb::dict& d, const char* name) {
    return mooncake::dict_field<T>(d, name, "settings");
}

// The batching decode pool's spec: the step's constants (CostModel.component_coefficients), the
// recompute's prefill time, the swap's link, the limits and the preemption mode.
mooncake::DecodeStep decode_step_from(const nb::dict& co) {
    mooncake::DecodeStep st;
    st.weights_s = setting<double>(co, "weights_s");
    st.linear_token_s = setting<double>(co, "linear_token_s");
    st.attention_pair_s = setting<double>(co, "attention_pair_s");
    st.kv_token_s = setting<double>(co, "kv_token_s");
    st.elementwise_token_s = setting<double>(co, "elementwise_token_s");
    st.allreduce_fixed_s = setting<double>(co, "allreduce_fixed_s");
    st.allreduce_token_s = setting<double>(co, "allreduce_token_s");
    st.overhead_s = setting<double>(co, "overhead_s");
    return st;
}

mooncake::DecodeSpec decode_from(const nb::dict& d) {
    mooncake::DecodeSpec spec;
    spec.step = decode_step_from(setting<nb::dict>(d, "step"));
    spec.recompute = mooncake::prefill_from(setting<nb::dict>(d, "recompute"));
    spec.kv_bytes_per_token = setting<int64_t>(d, "kv_bytes_per_token");
    spec.dram_bandwidth = setting<double>(d, "dram_bandwidth");
    spec.capacity_tokens = setting<int64_t>(d, "capacity_tokens");
    spec.max_running = setting<int64_t>(d, "max_running");
    spec.tbt_slo_s = setting<double>(d, "tbt_slo_s");
    const std::string mode = setting<std::string>(d, "preemption");
    if (mode == "abort") spec.preemption = mooncake::Preemption::Abort;
    else if (mode == "recompute") spec.preemption = mooncake::Preemption::Recompute;
    else if (mode == "swap") spec.preemption = mooncake::Preemption::Swap;
    else throw nb::value_error(("preemption: expected abort, recompute or swap, got " + mode).c_str());
    return spec;
}

// A router from its name ("least_queue", or one of engine.hpp's policies), threshold and generator.
Router router_from(const std::string& name, double threshold, const Pcg64& rng) {
    Router r;
    r.policy.threshold = threshold;
    r.rng = rng;
    if (name == "least_queue") r.least_queue = true;
    else if (name == "random") r.policy.kind = mooncake::Policy::Random;
    else if (name == "load") r.policy.kind = mooncake::Policy::Load;
    else if (name == "cache") r.policy.kind = mooncake::Policy::Cache;
    else if (name == "kvcentric") r.policy.kind = mooncake::Policy::KVCentric;
    else throw nb::value_error(("router: expected least_queue, random, load, cache or kvcentric, got " + name).c_str());
    return r;
}

Admission admission_from(const std::string& name) {
    if (name == "all") return Admission::All;
    if (name == "baseline") return Admission::Baseline;
    if (name == "early") return Admission::Early;
    throw nb::value_error(("admission: expected all, baseline or early, got " + name).c_str());
}

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> array(const std::vector<T>& v) {
    T* data = new T[v.size() ? v.size() : 1];
    if (!v.empty()) std::memcpy(data, v.data(), v.size() * sizeof(T));
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
    return nb::ndarray<nb::numpy, T, nb::ndim<1>>(data, {v.size()}, owner);
}

template <typename T>
nb::tuple as_tuple(const std::vector<T>& v) {
    nb::list out;
    for (const T& x : v) out.append(x);
    return nb::tuple(out);
}

void check_pending(const Cluster& c, const char* what) {
    if (c.done()) throw nb::index_error((std::string(what) + ": the workload is exhausted").c_str());
}

}  // namespace

void bind_cluster(nb::module_& m) {
    m.def("decode_step_coefficients",
          [](const nb::dict& step, int64_t batch) {
              return decode_step_from(step)(batch);
          },
          "step"_a, "batch"_a, "CostModel.decode_step_coefficients(batch) from the step's constants, in the engine.");
    m.def("trace_take",
          [](const mooncake::TraceColumns& base,
             nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> idx,
             nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu> arrival) {
              // the columns native_trace makes of Trace.take(idx, arrival_s=arrival): the base's rows in
              // that order, dense block indices renumbered in order of first appearance (a table over the
              // base's dense indices instead of hashing the ids again), the ids themselves kept
              const size_t n = idx.shape(0);
              if (arrival.shape(0) != n) throw nb::value_error("arrival_s: expected one arrival time per index");
              const int64_t* ix = idx.data();
              const int64_t* bounds = base.block_start.data();
              const int32_t* blocks = base.blocks.data();
              std::vector<int64_t> input(n), start(n + 1, 0);
              for (size_t q = 0; q < n; ++q) {
                  const int64_t k = ix[q];
                  if (k < 0 || k >= base.size()) throw nb::value_error("indices: expected rows of the base trace");
                  input[q] = base.input_tokens[static_cast<size_t>(k)];
                  start[q + 1] = start[q] + (bounds[k + 1] - bounds[k]);
              }
              std::vector<int64_t> dense(static_cast<size_t>(start[n]));
              std::vector<int64_t> unique(std::min(dense.size(), static_cast<size_t>(base.n_unique())));
              std::vector<int32_t> renumbered(static_cast<size_t>(base.n_unique()), -1);
              int32_t* table = renumbered.data();
              int64_t* out = dense.data();
              const int64_t* ids = base.unique_ids.data();
              int32_t next = 0;
              for (size_t q = 0; q < n; ++q) {
                  for (int64_t j = bounds[ix[q]], e = bounds[ix[q] + 1]; j < e; ++j) {
                      const int32_t b = blocks[j];
                      if (table[b] < 0) {
                          unique[static_cast<size_t>(next)] = ids[b];
                          table[b] = next++;
                      }
                      *out++ = table[b];
                  }
              }
              unique.resize(static_cast<size_t>(next));
              auto t = std::make_shared<mooncake::TraceColumns>(
                  std::vector<double>(arrival.data(), arrival.data() + n), std::move(input), std::move(start),
                  dense.data(), dense.size());  // (numbered in order of first appearance: no hashing)
              t->unique_ids = std::move(unique);
              return t;
          },
          "base"_a, "indices"_a, "arrival_s"_a,
          "native_trace of Trace.take(indices, arrival_s) made from the base trace's columns (no hashing).");
    m.def("tail_means",
          [](const std::vector<int64_t>& offsets, std::vector<double> intervals, double share) {
              std::vector<double> tbt, top, mean;
              if (offsets.empty() || offsets.front() != 0 || offsets.back() != static_cast<int64_t>(intervals.size()))
                  throw nb::value_error("offsets: expected offsets from 0 to len(intervals)");
              for (size_t q = 1; q < offsets.size(); ++q)
                  if (offsets[q] < offsets[q - 1]) throw nb::value_error("offsets: not sorted");
              mooncake::tail_means(offsets, intervals, share, tbt, top, mean);
              return nb::make_tuple(array(tbt), array(top), array(mean));
          },
          "offsets"_a, "intervals"_a, "share"_a, "sim/decode.py tail_means in the engine: (tbt, max, mean) arrays.");
    m.def("prefill_iteration_s",
          [](const nb::dict& fields, const std::vector<std::pair<int64_t, int64_t>>& chunks) {
              const mooncake::PrefillTime f = mooncake::prefill_from(fields);
              double compute = 0.0, attention = 0.0;
              int64_t tokens = 0;
              for (const auto& [p, e] : chunks) {
                  compute += f.chunk_compute_s(p, e);
                  attention += f.chunk_attention_s(p, e);
                  tokens += e - p;
              }
              return nb::make_tuple(compute, attention, f.iteration_s(compute, tokens, attention));
          },
          "fields"_a, "chunks"_a,
          "One batched prefill iteration of chunks (p, e) in the engine: (the chunks' linear s, attention s, "
          "PrefillTime.iteration_s).");
    nb::class_<Cluster::Snapshot>(m, "ClusterSnapshot", "An opaque copy of a Cluster's state (Cluster.snapshot).");
    nb::class_<mooncake::ClusterEnvCore::Snapshot>(m, "ClusterEnvSnapshot",
                                                   "An opaque copy of a ClusterEnvCore's reward sums (env_snapshot).");
    m.def("env_snapshot", [](const mooncake::ClusterEnvCore& core) { return core.snapshot(); }, "core"_a,
          "The v1 env core's reward sums, to take with its cluster's snapshot.");
    m.def("env_restore",
          [](mooncake::ClusterEnvCore& core, const mooncake::ClusterEnvCore::Snapshot& s) { core.restore(s); },
          "core"_a, "snapshot"_a,
          "Back to the core's sums of env_snapshot (after its cluster's restore); writes the pending observation.");
    nb::class_<Cluster>(m, "Cluster",
                               "sim/cluster.py's ClusterSimulator, one request at a time per prefill instance, reserve "
                        "or batching decode (mooncake_gym/_engine/cluster.py).")
        .def("__init__",
             [](Cluster* self, std::shared_ptr<mooncake::TraceColumns> trace, std::vector<int64_t> output,
                mooncake::RoutingEngine& pool, const nb::dict& d, const std::string& router, double threshold,
                const Pcg64& rng) {
                 mooncake::ClusterSettings s;
                 s.n_decode = setting<int64_t>(d, "n_decode");
                 s.capacity_tokens = setting<int64_t>(d, "capacity_tokens");
                 s.tbt_s = setting<double>(d, "tbt_s");
                 s.ttft_slo_s = setting<double>(d, "ttft_slo_s");
                 s.tbt_slo_s = setting<double>(d, "tbt_slo_s");
                 s.sample_period_s = setting<double>(d, "sample_period_s");
                 s.lecture_loads = setting<bool>(d, "lecture_loads");
                 s.refuse_never_fit = setting<bool>(d, "refuse_never_fit");
                 s.compensated_sum = setting<bool>(d, "compensated_sum");
                 s.mean_output_tokens = setting<double>(d, "mean_output_tokens");
                 s.batching = setting<bool>(d, "batching");
                 if (s.batching) {
                     s.check_tbt = setting<bool>(d, "check_tbt");
                     s.kv_transfer = setting<bool>(d, "kv_transfer");
                     s.decode = decode_from(setting<nb::dict>(d, "decode"));
                     s.idle_step_s = setting<double>(d, "idle_step_s");
                     s.kv_bytes_per_token = setting<int64_t>(d, "kv_bytes_per_token");
                     s.rdma_bandwidth = setting<double>(d, "rdma_bandwidth");
                     s.transfer_latency_s = setting<double>(d, "transfer_latency_s");
                     s.n_layers = setting<int64_t>(d, "n_layers");
                     if (s.n_layers < 1) throw nb::value_error("n_layers: expected >= 1");
                 }
                 s.n_prefill = pool.n_instances();
                 s.prefill_batching = setting<bool>(d, "prefill_batching");
                 if (s.prefill_batching) {  // the engines' mechanisms (batching.hpp)
                     s.prefill_token_budget = setting<int64_t>(d, "prefill_token_budget");
                     if (s.prefill_token_budget < 1) throw nb::value_error("prefill_token_budget: expected >= 1");
                     s.shared_nics = setting<bool>(d, "shared_nics");
                     s.pull_kv_bytes_per_token = setting<int64_t>(d, "pull_kv_bytes_per_token");
                     s.nic_bandwidth = setting<double>(d, "nic_bandwidth");
                     s.pull_latency_s = setting<double>(d, "pull_latency_s");
                     if (!(s.nic_bandwidth > 0)) throw nb::value_error("nic_bandwidth: expected > 0");
                     s.pipeline_nodes = setting<int64_t>(d, "pipeline_nodes");
                     if (s.pipeline_nodes > 1) {
                         s.pipeline_min_tokens = setting<int64_t>(d, "pipeline_min_tokens");
                         for (const auto& v : setting<std::vector<std::vector<double>>>(d, "pipeline_send")) {
                             if (v.size() != 3) throw nb::value_error("pipeline_send: expected 3 numbers per instance");
                             s.pipeline_send.push_back({v[0], v[1], v[2]});
                         }
                     }
                 }
                 if (!(s.sample_period_s > 0)) throw nb::value_error("sample_period_s: expected > 0");
                 try {
                     new (self) Cluster(std::move(trace), std::move(output), pool, s,
                                               router_from(router, threshold, rng));
                 } catch (const std::invalid_argument& e) {
                     throw nb::value_error(e.what());
                 }
             },
             "trace"_a, "output_tokens"_a, "pool"_a, "settings"_a, "router"_a, "threshold"_a, "rng"_a,
             nb::keep_alive<1, 2>(), nb::keep_alive<1, 4>())
        .def("reset", [](Cluster& c, const Pcg64& rng) { c.reset(rng); }, "rng"_a)
        .def("snapshot", &Cluster::snapshot,
             "A copy of the whole state, its prefill pool's included (an opaque ClusterSnapshot for restore).")
        .def("restore",
             [](Cluster& c, const Cluster::Snapshot& s) {
                 try {
                     c.restore(s);
                 } catch (const std::invalid_argument& e) {
                     throw nb::value_error(e.what());
                 }
             },
             "snapshot"_a, "Back to the state of a snapshot of this cluster (it stays valid for more restores).")
        .def_prop_ro("done", &Cluster::done)
        .def_prop_ro("index", &Cluster::index)
        .def_prop_ro("now", &Cluster::now)
        .def("router_rng", [](Cluster& c) { return c.router_rng(); },
             "A copy of the default router's generator as the run has left it.")
        .def("default_route",
             [](Cluster& c) {
                 check_pending(c, "default_route");
                 const auto& d = c.default_route();
                 return nb::make_tuple(d.instance, d.pull, d.prefill_s, d.finish);
             },
             "The default router's (instance, pull, prefill_s, predicted prefill finish) on the pending request.")
        .def("decode_fields",
             [](Cluster& c, double tbt_s) {
                 check_pending(c, "decode_fields");
                 nb::list batch, used, step, with;
                 if (c.decoders().empty()) {
                     for (int64_t b : c.batch()) {
                         step.append(b ? tbt_s : 0.0);
                         with.append(tbt_s);
                     }
                     return nb::make_tuple(as_tuple(c.batch()), as_tuple(c.used()), nb::tuple(step), nb::tuple(with),
                                           c.mean_decode_s());
                 }
                 for (const auto& l : c.decode_loads()) {
                     batch.append(l.batch);
                     used.append(l.used);
                     step.append(l.step);
                     with.append(l.step_with);
                 }
                 return nb::make_tuple(nb::tuple(batch), nb::tuple(used), nb::tuple(step), nb::tuple(with),
                                       c.mean_decode_s());
             },
             "tbt_s"_a, "ClusterSimulator.decode_fields: (batch, used, step, step with the request, mean decode s).")
        .def("admits",
             [](Cluster& c, const std::string& rule, double ttft_slo_s, double threshold) {
                 check_pending(c, "admits");
                 return c.admits(admission_from(rule), ttft_slo_s, threshold);
             },
             "rule"_a, "ttft_slo_s"_a, "threshold"_a)
        .def("apply",
             [](Cluster& c, bool admit, int64_t inst, bool pull, int64_t decode) {
                 check_pending(c, "apply");
                 if (inst >= c.pool().n_instances()) throw nb::value_error("apply: prefill instance out of range");
                 if (decode >= static_cast<int64_t>(c.used().size()))
                     throw nb::value_error("apply: decode instance out of range");
                 c.apply(admit, inst, pull, decode);
             },
             "admit"_a, "instance"_a, "pull"_a, "decode"_a,
             "Apply the pending decision (instance < 0: the default router's route; decode < 0: the default rule).")
        .def("run",
             [](Cluster& c, const std::string& rule, double ttft_slo_s, double threshold, nb::object routing,
                double routing_threshold, nb::object routing_rng) {
                 const Admission a = admission_from(rule);
                 Router r;
                 const bool routed = !routing.is_none();
                 if (routed)
                     r = router_from(nb::cast<std::string>(routing), routing_threshold, nb::cast<const Pcg64&>(routing_rng));
                 {
                     nb::gil_scoped_release release;
                     c.run(a, ttft_slo_s, threshold, routed ? &r : nullptr);
                 }
                 return routed ? nb::cast(r.rng) : nb::none();
             },
             "rule"_a, "ttft_slo_s"_a, "threshold"_a, "routing"_a.none(), "routing_threshold"_a, "routing_rng"_a.none(),
             "Every remaining decision by the native rules; returns the routing policy's generator (None without).")
        .def("records",
             [](const Cluster& c) {
                 return nb::make_tuple(array(c.outcome()), array(c.ttft_s()), array(c.prefill_s()),
                                       array(c.prefill_instance()), array(c.decode_instance()),
                                       array(c.decode_start_s()), array(c.end_s()), array(c.tbt_s()),
                                       array(c.prefill_end_s()), array(c.max_interval_s()), array(c.mean_interval_s()));
             },
             "(outcome, ttft_s, prefill_s, prefill_instance, decode_instance, decode_start_s, end_s, tbt_s, "
             "prefill_end_s, max_interval_s, mean_interval_s) arrays.")
        .def("samples",
             [](const Cluster& c) {
                 return nb::make_tuple(array(c.samples_t()), array(c.samples_p()), array(c.samples_d()),
                                       array(c.samples_kv()));
             })
        .def("counters", &Cluster::counters,
             "(completed, completed_in_ttft_slo, admitted, rejected_at_arrival, rejected_after_prefill, "
             "refused_too_long, granted, granted_in_ttft_slo, requests_in_prefill, requests_in_decode, preempted).")
        .def_prop_ro("wasted_prefill_s", &Cluster::wasted_prefill_s)
        .def("wasted_log",
             [](const Cluster& c, size_t start) {
                 nb::list out;
                 for (size_t k = start; k < c.wasted_t().size(); ++k)
                     out.append(nb::make_tuple(c.wasted_t()[k], c.wasted_s()[k]));
                 return out;
             },
             "start"_a, "The (time, wasted prefill s) of each rejection after prefill from the start-th on.")
        .def_prop_ro("n_wasted", [](const Cluster& c) { return c.wasted_t().size(); })
        .def("finish_tbt", &Cluster::finish_tbt, "share"_a,
             "ClusterSimulator.finish_tbt: the TBT of every request finished since the last call (the mean of "
             "its largest share of token intervals, its largest and mean interval), as sim/decode.py tail_means.")
        .def("prefill_fifo",
             [](const Cluster& c) {
                 nb::list out;
                 for (const auto& fifo : c.prefill_fifo()) {
                     nb::list one;
                     for (const auto& [f, r] : fifo) one.append(nb::make_tuple(f, r));
                     out.append(one);
                 }
                 return out;
             },
             "Batching prefill: each instance's (prefill end, request) of the requests in prefill, in "
             "ClusterSimulator._prefill_fifo's order.")
        .def("network_totals",
             [](const Cluster& c) { return nb::make_tuple(c.network().bytes_sent(), c.network().transfers()); },
             "Shared NICs: (bytes sent, transfers) so far (Network.bytes_sent, Network.transfers).")
        .def("prefill_runs",
             [](Cluster& c) {
                 std::vector<int64_t> iterations, pipelined;
                 if (c.pool().batched())
                     for (int64_t i = 0; i < c.pool().n_instances(); ++i) {
                         iterations.push_back(c.pool().iterations(i));
                         pipelined.push_back(c.pool().pipelined_runs(i));
                     }
                 return nb::make_tuple(iterations, pipelined);
             },
             "Batching prefill: each instance's (iterations formed, prompts pipelined from it) so far "
             "(PrefillEngine.iterations, pipelined_runs).")
        .def("busy_until", [](Cluster& c) { return c.pool().busy_until(); },
             "Each prefill instance's busy-until time.")
        .def("used", [](const Cluster& c) { return c.used(); })
        .def("batch", [](const Cluster& c) { return c.batch(); })
        .def("decoder_state",
             [](const Cluster& c, size_t j) {
                 if (j >= c.decoders().size()) throw nb::index_error("decoder_state: no such batching decode instance");
                 const mooncake::BatchingDecode& d = c.decoders()[j];
                 nb::dict out;
                 out["batch"] = d.batch();
                 out["pending_tokens"] = d.pending_tokens();
                 out["pending_requests"] = d.pending_requests();
                 out["t0"] = d.t0();
                 out["it0"] = d.it0();
                 out["k_base"] = d.k_base();
                 out["version"] = d.version();
                 out["next_event_s"] = d.next_event_s();
                 out["busy_s"] = d.busy_s();
                 out["preemptions"] = d.preemptions();
                 out["preemption_stall_s"] = d.preemption_stall_s();
                 out["recomputed_tokens"] = d.recomputed_tokens();
                 out["n_finished"] = d.finished().size();
                 return out;
             },
             "j"_a, "Batching decode instance j's state (BatchingDecodeInstance's attributes of the same names).")
        .def("token_intervals",
             [](const Cluster& c, size_t j, size_t start) {
                 if (j >= c.decoders().size()) throw nb::index_error("token_intervals: no such batching decode instance");
                 std::vector<int64_t> req, offsets;
                 std::vector<double> intervals;
                 c.decoders()[j].token_intervals(start, req, offsets, intervals);
                 return nb::make_tuple(array(req), array(offsets), array(intervals));
             },
             "j"_a, "start"_a,
             "BatchingDecodeInstance.token_intervals(finished[start:]): (requests, offsets, intervals) arrays.")
        .def("set_tbt",
             [](Cluster& c, const std::vector<int64_t>& req, const std::vector<double>& tbt, const std::vector<double>& top,
                const std::vector<double>& mean) {
                 const size_t n = c.outcome().size();
                 if (tbt.size() != req.size() || top.size() != req.size() || mean.size() != req.size())
                     throw nb::value_error("set_tbt: expected one tbt, max and mean per request");
                 for (size_t k = 0; k < req.size(); ++k) {
                     if (req[k] < 0 || static_cast<size_t>(req[k]) >= n) throw nb::value_error("set_tbt: request out of range");
                     c.set_tbt(req[k], tbt[k], top[k], mean[k]);
                 }
             },
             "requests"_a, "tbt"_a, "max"_a, "mean"_a, "The TBT, slowest and mean interval of finished requests.");
}
