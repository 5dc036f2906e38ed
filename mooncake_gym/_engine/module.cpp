// mooncake_gym._engine_native: the Python binding of engine.hpp (nanobind). The Python side that
// feeds it (the trace's columns, each instance kind's PrefillTime fields, the policy's generator
// state) is mooncake_gym/_engine/routing.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "engine.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using mooncake::Pcg64;
using mooncake::Policy;
using mooncake::RoutingEngine;
using mooncake::TraceColumns;

#ifndef MOONCAKE_ENGINE_FINGERPRINT
#define MOONCAKE_ENGINE_FINGERPRINT ""
#endif

namespace {

using F64 = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T, typename A>
std::vector<T> to_vector(const A& a) {
    return std::vector<T>(a.data(), a.data() + a.shape(0));
}

template <typename T>
T field(const nb::dict& d, const char* name) {
    if (!d.contains(name)) throw nb::value_error((std::string("prefill: missing field ") + name).c_str());
    return nb::cast<T>(d[name]);
}

mooncake::PrefillTime prefill_from(const nb::dict& d) {
    mooncake::PrefillTime p;
    p.n_layers = field<int64_t>(d, "n_layers");
    p.linear = field<double>(d, "linear");
    p.attention = field<double>(d, "attention");
    p.flops = field<double>(d, "flops");
    p.kv_bytes = field<int64_t>(d, "kv_bytes");
    p.bandwidth = field<double>(d, "bandwidth");
    p.loads = field<bool>(d, "loads");
    p.overlap = field<bool>(d, "overlap");
    p.overhead_s = field<double>(d, "overhead_s");
    p.realistic = field<bool>(d, "realistic");
    p.chunk = field<int64_t>(d, "chunk");
    p.weights_s = field<double>(d, "weights_s");
    p.step_fixed_s = field<double>(d, "step_fixed_s");
    p.ar_token_s = field<double>(d, "ar_token_s");
    p.attention_efficiency = field<double>(d, "attention_efficiency");
    p.kv_token_s = field<double>(d, "kv_token_s");
    p.elementwise_token_s = field<double>(d, "elementwise_token_s");
    if (p.n_layers < 1 || p.chunk < 1) throw nb::value_error("prefill: n_layers and chunk must be >= 1");
    return p;
}

Policy policy_from(const std::string& name) {
    if (name == "random") return Policy::Random;
    if (name == "load") return Policy::Load;
    if (name == "cache") return Policy::Cache;
    if (name == "kvcentric") return Policy::KVCentric;
    throw nb::value_error(("policy: expected one of random, load, cache, kvcentric, got " + name).c_str());
}

using U64 = uint64_t;
using RngState = std::tuple<U64, U64, U64, U64, bool, uint32_t>;

Pcg64 rng_from(const RngState& s) {
    Pcg64 r;
    r.state = (static_cast<unsigned __int128>(std::get<0>(s)) << 64) | std::get<1>(s);
    r.inc = (static_cast<unsigned __int128>(std::get<2>(s)) << 64) | std::get<3>(s);
    r.has_uint32 = std::get<4>(s);
    r.uinteger = std::get<5>(s);
    return r;
}

RngState rng_state(const Pcg64& r) {
    return {static_cast<U64>(r.state >> 64), static_cast<U64>(r.state), static_cast<U64>(r.inc >> 64),
            static_cast<U64>(r.inc), r.has_uint32, r.uinteger};
}

template <typename T>
nb::tuple as_tuple(const std::vector<T>& v) {
    nb::list out;
    for (const T& x : v) out.append(x);
    return nb::tuple(out);
}

}  // namespace

void bind_cluster(nb::module_& m);  // cluster.cpp

NB_MODULE(_engine_native, m) {
    m.doc() = "The native engine of mooncake-gym (docs/engine.md): the prefill pool's routing simulator.";
    m.attr("FINGERPRINT") = MOONCAKE_ENGINE_FINGERPRINT;
    m.attr("POLICIES") = nb::make_tuple("random", "load", "cache", "kvcentric");

    m.def("prefill_s", [](const nb::dict& fields, int64_t n, int64_t h) { return prefill_from(fields)(n, h); },
          "fields"_a, "n_tokens"_a, "cached_tokens"_a,
          "The engine's prefill time of an n-token prompt with h cached tokens, from PrefillTime's fields.");

    nb::class_<Pcg64>(m, "Pcg64", "numpy's PCG64 bit generator with Generator.integers(n), from a state tuple "
                                  "(state_hi, state_lo, inc_hi, inc_lo, has_uint32, uinteger).")
        .def("__init__", [](Pcg64* self, const RngState& s) { new (self) Pcg64(rng_from(s)); }, "state"_a)
        .def("state", [](const Pcg64& r) { return rng_state(r); })
        .def("integers", &Pcg64::integers, "n"_a)
        .def("next64", &Pcg64::next64);

    nb::class_<TraceColumns>(m, "Trace", "A trace's columns as the engine reads them (made once per trace).")
        .def("__init__",
             [](TraceColumns* self, F64 arrival, I64 input, I64 block_start, I64 block_ids) {
                 try {
                     new (self) TraceColumns(to_vector<double>(arrival), to_vector<int64_t>(input),
                                             to_vector<int64_t>(block_start), block_ids.data(), block_ids.shape(0));
                 } catch (const std::invalid_argument& e) {
                     throw nb::value_error(e.what());
                 }
             },
             "arrival_s"_a, "input_tokens"_a, "block_start"_a, "block_ids"_a)
        .def("__len__", &TraceColumns::size)
        .def_prop_ro("n_unique", &TraceColumns::n_unique);

    bind_cluster(m);
    nb::class_<RoutingEngine>(m, "RoutingEngine")
        .def("__init__",
             [](RoutingEngine* self, std::shared_ptr<TraceColumns> t, std::vector<int64_t> cache_blocks,
                std::vector<int32_t> group, std::vector<nb::dict> prefill, nb::dict pool) {
                 double cells = 0;  // (mooncake_gym/_engine/routing.py MAX_CACHE_CELLS)
                 for (int64_t c : cache_blocks) cells += c > 0 ? static_cast<double>(t->n_unique()) : 0.0;
                 if (cells > double(1 << 26))
                     throw nb::value_error("engine: caches x distinct blocks above 2**26 (the caches' arrays)");
                 for (int64_t c : cache_blocks)
                     if (c < 0) throw nb::value_error("cache_blocks: expected integers >= 0");
                 std::vector<mooncake::PrefillTime> times;
                 for (const nb::dict& d : prefill) times.push_back(prefill_from(d));
                 mooncake::PoolCosts pc;
                 pc.block_tokens = field<int64_t>(pool, "block_tokens");
                 pc.kv_bytes_per_token = field<int64_t>(pool, "kv_bytes_per_token");
                 pc.rdma_bandwidth = field<double>(pool, "rdma_bandwidth");
                 pc.transfer_latency_s = field<double>(pool, "transfer_latency_s");
                 new (self) RoutingEngine(std::move(t), std::move(cache_blocks), std::move(group), std::move(times), pc);
             },
             "trace"_a, "cache_blocks"_a, "group"_a, "prefill"_a, "pool"_a)
        .def("reset", &RoutingEngine::reset)
        .def_prop_ro("done", &RoutingEngine::done)
        .def_prop_ro("index", &RoutingEngine::index)
        .def_prop_ro("n_instances", &RoutingEngine::n_instances)
        .def("run",
             [](RoutingEngine& e, const std::string& policy, double threshold, const RngState& s) {
                 Pcg64 rng = rng_from(s);
                 const Policy p = policy_from(policy);
                 {
                     nb::gil_scoped_release release;
                     e.run(p, threshold, rng);
                 }
                 return rng_state(rng);
             },
             "policy"_a, "threshold"_a, "rng"_a, "Route every remaining request with a native policy; returns the "
                                                "generator's state after the run.")
        .def("decide",
             [](RoutingEngine& e, const std::string& policy, double threshold, Pcg64& rng) {
                 if (e.done()) throw nb::index_error("decide: the trace is exhausted");
                 return e.decide(policy_from(policy), threshold, rng);
             },
             "policy"_a, "threshold"_a, "rng"_a)
        .def("serve",
             [](RoutingEngine& e, int64_t i, bool pull) {
                 if (e.done()) throw nb::index_error("serve: the trace is exhausted");
                 if (i < 0 || i >= e.n_instances()) throw nb::value_error("serve: instance out of range");
                 e.serve(i, pull);
             },
             "instance"_a, "pull"_a)
        .def("rows",
             [](const RoutingEngine& e) {
                 const auto& rows = e.rows();
                 const size_t n = rows.size();
                 double* data = new double[n * 9];
                 if (n) std::memcpy(data, rows.data(), n * sizeof(mooncake::Row));
                 nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<double*>(p); });
                 return nb::ndarray<nb::numpy, double, nb::ndim<2>>(data, {n, size_t(9)}, owner);
             },
             "The dispatched requests' rows, (n, 9) float64 in the fields of sim/routing.py _ARRAYS.")
        .def("skip",
             [](RoutingEngine& e) {
                 if (e.done()) throw nb::index_error("skip: the trace is exhausted");
                 e.skip();
             })
        .def("last_row",
             [](const RoutingEngine& e) {
                 if (e.rows().empty()) throw nb::index_error("last_row: nothing dispatched");
                 const mooncake::Row& r = e.rows().back();
                 return nb::make_tuple(r.arrival_s, static_cast<int64_t>(r.input_tokens), static_cast<int64_t>(r.instance),
                                       r.ttft_s, r.queue_s, r.transfer_s, r.prefill_s, static_cast<int64_t>(r.hit_tokens),
                                       static_cast<int64_t>(r.fetched_tokens));
             },
             "The last dispatched request's row (arrival_s, input_tokens, instance, ttft_s, queue_s, transfer_s, "
             "prefill_s, hit_tokens, fetched_tokens), with Python ints for the counts.")
        .def("full_view",
             [](RoutingEngine& e) {
                 if (e.done()) throw nb::index_error("full_view: the trace is exhausted");
                 const int64_t k = e.index();
                 nb::tuple queue = as_tuple(e.view_queue_s());
                 return nb::make_tuple(e.arrival_s(k), k, e.input_tokens(k), queue, as_tuple(e.view_queued_requests()),
                                       as_tuple(e.view_hit_tokens()), as_tuple(e.view_prefill_s()),
                                       e.view_best_hit_tokens(), e.view_best_instance(), as_tuple(e.view_transfer_s()),
                                       as_tuple(e.view_pull_prefill_s()), as_tuple(e.view_queued_tokens()),
                                       as_tuple(e.view_hit_blocks()));
             },
             "The pending view's (now, index, input_tokens, queue_s, queued_requests, hit_tokens, prefill_s, "
             "best_hit_tokens, best_instance, transfer_s, pull_prefill_s, queued_tokens, hit_blocks).")
        .def("busy_s", [](const RoutingEngine& e) { return e.busy_s(); })
        .def("requests", [](const RoutingEngine& e) { return e.requests(); })
        .def("cache_lru_first",
             [](const RoutingEngine& e, int64_t i) {
                 if (i < 0 || i >= e.n_instances()) throw nb::value_error("cache_lru_first: instance out of range");
                 return e.cache_lru_first(i);
             },
             "instance"_a)
        .def("view",
             [](RoutingEngine& e) {
                 if (e.done()) throw nb::index_error("view: the trace is exhausted");
                 return nb::make_tuple(as_tuple(e.view_queue_s()), as_tuple(e.view_hit_tokens()),
                                       as_tuple(e.view_prefill_s()), e.view_best_hit_tokens(),
                                       as_tuple(e.view_transfer_s()), as_tuple(e.view_pull_prefill_s()),
                                       as_tuple(e.view_hit_blocks()));
             },
             "The pending view's (queue_s, hit_tokens, prefill_s, best_hit_tokens, transfer_s, pull_prefill_s, "
             "hit_blocks).");
}
