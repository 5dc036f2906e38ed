// mooncake_gym._engine_native: the Python binding of engine.hpp (nanobind). The Python side that
// feeds it (the trace's columns, each instance kind's PrefillTime fields, the policy's generator
// state) is mooncake_gym/_engine/routing.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "admission.hpp"
#include "clusterenv.hpp"
#include "engine.hpp"
#include "fields.hpp"
#include "synthetic.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using mooncake::Pcg64;
using mooncake::Policy;
using mooncake::PolicySpec;
using mooncake::RoutingEnv;
using mooncake::SteppableEnv;
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
    return mooncake::dict_field<T>(d, name, "prefill");
}

using mooncake::prefill_from;

Policy policy_from(const std::string& name) {
    if (name == "random") return Policy::Random;
    if (name == "load") return Policy::Load;
    if (name == "cache") return Policy::Cache;
    if (name == "kvcentric") return Policy::KVCentric;
    if (name == "sizesplit") return Policy::SizeSplit;
    if (name == "relsplit") return Policy::RelSplit;
    throw nb::value_error(
        ("policy: expected one of random, load, cache, kvcentric, sizesplit, relsplit, got " + name).c_str());
}

// the production routers (production.hpp), by their names in mooncake_gym/baselines/production.py
bool production_from(const std::string& name, mooncake::Production& rule) {
    using mooncake::Production;
    static const std::pair<const char*, Production> rules[] = {
        {"dynamo", Production::Dynamo},       {"llmd", Production::LlmD},
        {"llmd_precise", Production::LlmD},   {"sglang", Production::SGLang},
        {"vllm_prefix", Production::VLLMPrefix}, {"vllm_kvaware", Production::VLLMKVAware},
        {"aibrix", Production::AIBrix},       {"preble", Production::Preble},
        {"lmetric", Production::LMetric},     {"p2c", Production::P2C},
        {"chbl", Production::CHBL}};
    for (const auto& [n, r] : rules)
        if (name == n) {
            rule = r;
            return true;
        }
    return false;
}

PolicySpec spec_of(const std::string& name, double threshold) {
    PolicySpec p;
    if (production_from(name, p.prod.rule))
        p.kind = Policy::Production;
    else
        p.kind = policy_from(name);
    p.threshold = threshold;
    return p;
}

using F32Out = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I8Out = nb::ndarray<int8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F64Out = nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// An env core's bind(obs, mask, info): the buffers it writes from now on, checked against the
// observation's, the mask's (n_mask) and the info row's (n_info) sizes; then the pending observation.
template <class Env>
void bind_buffers(Env& env, F32Out obs, I8Out mask, F64Out info, int64_t n_mask, int64_t n_info) {
    if (obs.shape(0) != static_cast<size_t>(env.n_obs()) || mask.shape(0) != static_cast<size_t>(n_mask) ||
        info.shape(0) != static_cast<size_t>(n_info))
        throw nb::value_error("bind: expected buffers of the observation's, the mask's and the info's sizes");
    env.obs = obs.data();
    env.mask = mask.data();
    env.info = info.data();
    env.observe();
}
using BoolArr = nb::ndarray<bool, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using BoolIn = nb::ndarray<const bool, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64In = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64Out = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using F64Block = nb::ndarray<double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64Block = nb::ndarray<int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using BoolBlock = nb::ndarray<bool, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// The native vector environment's batch (batch.hpp), each env kept alive by its Python object (the
// outputs by bind's keep_alive).
struct EnvBatch : mooncake::EnvBatch {
    std::vector<nb::object> owners;
    std::optional<I64In> launched_actions;  // a launched step's arguments, kept until its finish
    std::optional<BoolIn> launched_active;
    explicit EnvBatch(size_t n) : mooncake::EnvBatch(n), owners(n) {}
    ~EnvBatch() {  // a launched step still running reads the arrays kept here: wait for it first
        if (!launched_actions) return;
        try {
            finish();
        } catch (...) {
        }
    }
    // the arguments of step and launch checked (nb::value_error naming the bad one); the active mask or null
    const bool* checked(const I64In& actions, const std::optional<BoolIn>& active) {
        const size_t n = size();
        if (rewards == nullptr) throw nb::value_error("step: bind the outputs first");
        if (actions.shape(0) != n || (active && active->shape(0) != n))
            throw nb::value_error("step: expected actions (and active) of the batch's size");
        const bool* on = active ? active->data() : nullptr;
        try {
            check(actions.data(), on);
        } catch (const std::invalid_argument& e) {
            throw nb::value_error(e.what());
        }
        return on;
    }
};

// the info dict of RoutingSimulator.last from a RoutingEnv's info row
nb::dict routing_info(const double* r) {
    static const char* keys[] = {"index", "instance", "pull", "ttft_s", "queue_s", "transfer_s", "prefill_s",
                                 "hit_tokens", "fetched_tokens", "input_tokens"};
    static nb::object interned[10];
    if (!interned[0].is_valid())
        for (int k = 0; k < 10; ++k) interned[k] = nb::steal(PyUnicode_InternFromString(keys[k]));
    nb::dict d;
    d[interned[0]] = static_cast<int64_t>(r[0]);
    d[interned[1]] = static_cast<int64_t>(r[1]);
    d[interned[2]] = r[2] != 0.0;
    for (int k = 3; k < 7; ++k) d[interned[k]] = r[k];
    for (int k = 7; k < 10; ++k) d[interned[k]] = static_cast<int64_t>(r[k]);
    return d;
}

// -- the v1 environments' core (clusterenv.hpp) ----------------------------------------------------------
// ClusterEnv.step's info dict from a ClusterEnvCore's info row (ttft_s only when admitted)
nb::dict cluster_env_info(const double* r) {
    static const char* keys[] = {"index", "admitted", "prefill_instance", "good_tokens", "good_requests", "wasted_s",
                                 "completed", "rejected_at_arrival", "rejected_after_prefill", "preempted", "ttft_s"};
    constexpr int n = mooncake::V1_INFO_FIELDS;
    static nb::object interned[n];
    if (!interned[0].is_valid())
        for (int k = 0; k < n; ++k) interned[k] = nb::steal(PyUnicode_InternFromString(keys[k]));
    // (the C API directly: a step makes one such dict, and nanobind's item assignment costs more)
    nb::dict d;
    auto set = [&](int k, PyObject* value) {
        if (!value || PyDict_SetItem(d.ptr(), interned[k].ptr(), value) != 0) {
            Py_XDECREF(value);
            throw nb::python_error();
        }
        Py_DECREF(value);
    };
    set(0, PyLong_FromLongLong(static_cast<long long>(r[0])));
    set(1, PyBool_FromLong(r[1] != 0.0));
    for (int k = 2; k < 5; ++k) set(k, PyLong_FromLongLong(static_cast<long long>(r[k])));
    set(5, PyFloat_FromDouble(r[5]));
    for (int k = 6; k < 10; ++k) set(k, PyLong_FromLongLong(static_cast<long long>(r[k])));
    if (r[1] != 0.0) set(10, PyFloat_FromDouble(r[10]));
    return d;
}

mooncake::ClusterEnvSpec cluster_env_spec(const nb::dict& d) {
    auto get = [&](const char* name) { return mooncake::dict_field<double>(d, name, "spec"); };
    mooncake::ClusterEnvSpec s;
    const std::string kind = mooncake::dict_field<std::string>(d, "kind", "spec");
    if (kind == "routing") s.kind = mooncake::V1Kind::Routing;
    else if (kind == "admission") s.kind = mooncake::V1Kind::Admission;
    else if (kind == "conductor") s.kind = mooncake::V1Kind::Conductor;
    else throw nb::value_error(("kind: expected routing, admission or conductor, got " + kind).c_str());
    s.time_scale = get("time_scale");
    s.batch_cap = get("batch_cap");
    s.step_den = get("step_den");
    s.ttft_den = get("ttft_den");
    s.in_prefill_den = get("in_prefill_den");
    s.output_cap = get("output_cap");
    s.log_output_scale = get("log_output_scale");
    s.ttft_slo_s = get("ttft_slo_s");
    s.tbt_slo_s = get("tbt_slo_s");
    s.capacity_tokens = get("capacity_tokens");
    s.reserve_tbt_s = get("reserve_tbt_s");
    s.tail_share = get("tail_share");
    s.horizon = get("horizon");
    s.oracle = mooncake::dict_field<bool>(d, "oracle", "spec");
    s.prediction = mooncake::dict_field<bool>(d, "prediction", "spec");
    s.mean_output_tokens = get("mean_output_tokens");
    s.mean_prefill_s = get("mean_prefill_s");
    s.waste_penalty = get("waste_penalty");
    return s;
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
        .def("next64", &Pcg64::next64)
        .def("random", &Pcg64::random, "Generator.random()")
        .def("permutation", [](Pcg64& r, int64_t n) { return mooncake::permutation(r, n); }, "n"_a,
             "Generator.permutation(n) (production.hpp)")
        .def(
            "choice",
            [](Pcg64& r, int64_t n, int64_t d) {
                if (d < 0 || d > n) throw nb::value_error("choice: expected 0 <= size <= n");
                try {
                    return mooncake::choice_without_replacement(r, n, d);
                } catch (const std::invalid_argument& e) {
                    throw nb::value_error(e.what());
                }
            },
            "n"_a, "size"_a, "Generator.choice(n, size, replace=False) (production.hpp)");

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
        .def_static("from_blocks",
             [](F64 arrival, I64 input, nb::handle block_ids) {
                 // the trace's block_ids (a sequence of sequences of ints) read directly
                 std::vector<int64_t> start{0}, ids;
                 nb::object outer = nb::steal(PySequence_Fast(block_ids.ptr(), "block_ids: expected a sequence"));
                 if (!outer.is_valid()) throw nb::python_error();
                 const Py_ssize_t n = PySequence_Fast_GET_SIZE(outer.ptr());
                 start.reserve(static_cast<size_t>(n) + 1);
                 for (Py_ssize_t k = 0; k < n; ++k) {
                     nb::object row = nb::steal(PySequence_Fast(PySequence_Fast_GET_ITEM(outer.ptr(), k),
                                                                "block_ids: expected a sequence of block ids per request"));
                     if (!row.is_valid()) throw nb::python_error();
                     const Py_ssize_t m = PySequence_Fast_GET_SIZE(row.ptr());
                     PyObject** items = PySequence_Fast_ITEMS(row.ptr());
                     for (Py_ssize_t j = 0; j < m; ++j) {
                         const long long v = PyLong_AsLongLong(items[j]);
                         if (v == -1 && PyErr_Occurred()) throw nb::python_error();
                         ids.push_back(v);
                     }
                     start.push_back(static_cast<int64_t>(ids.size()));
                 }
                 try {
                     return std::make_shared<TraceColumns>(to_vector<double>(arrival), to_vector<int64_t>(input),
                                                           std::move(start), ids.data(), ids.size());
                 } catch (const std::invalid_argument& e) {
                     throw nb::value_error(e.what());
                 }
             },
             "arrival_s"_a, "input_tokens"_a, "block_ids"_a, "The trace's columns from its block_ids lists.")
        .def("__len__", &TraceColumns::size)
        .def_prop_ro("n_unique", &TraceColumns::n_unique);

    // --- issue 25's speed work: the synthetic generator's block ids (synthetic.hpp) ---
    nb::class_<mooncake::SyntheticAssembly>(m, "SyntheticAssembly",
                                            "The synthetic trace assembled from numpy's draws (synthetic.hpp).")
        .def(nb::init<double, int64_t, int64_t, int64_t, std::vector<double>, std::vector<int64_t>>(),
             "document_share"_a, "output_max"_a, "input_max"_a, "block_tokens"_a, "cdf"_a, "prompt_blocks"_a)
        .def("requests",
             [](const mooncake::SyntheticAssembly&, F64 doc_u, I64 questions, I64 turns, double share) {
                 if (questions.shape(0) != doc_u.shape(0) || turns.shape(0) != doc_u.shape(0))
                     throw nb::value_error("requests: expected one document draw, question and turn count per session");
                 return mooncake::SyntheticAssembly::batch_requests(doc_u.shape(0), doc_u.data(), questions.data(),
                                                                    turns.data(), share);
             },
             "doc_u"_a, "questions"_a, "turns"_a, "document_share"_a, "A batch's request count.")
        .def("add",
             [](mooncake::SyntheticAssembly& a, F64 start, F64 prompt_u, F64 doc_u, F64 doc_len, F64 chat_len,
                I64 questions, I64 turns, F64 out, F64 question, F64 turn, F64 think) {
                 const size_t s = start.shape(0), r = out.shape(0);
                 for (size_t m : {prompt_u.shape(0), doc_u.shape(0), doc_len.shape(0), chat_len.shape(0),
                                  questions.shape(0), turns.shape(0)})
                     if (m != s) throw nb::value_error("add: expected one draw of each per session");
                 for (size_t m : {question.shape(0), turn.shape(0), think.shape(0)})
                     if (m != r) throw nb::value_error("add: expected one draw of each per request");
                 try {
                     a.add(s, start.data(), prompt_u.data(), doc_u.data(), doc_len.data(), chat_len.data(),
                           questions.data(), turns.data(), r, out.data(), question.data(), turn.data(), think.data());
                 } catch (const std::invalid_argument& e) {
                     throw nb::value_error(e.what());
                 }
             },
             "start"_a, "prompt_u"_a, "doc_u"_a, "doc_len"_a, "chat_len"_a, "questions"_a, "turns"_a, "out"_a,
             "question"_a, "turn"_a, "think"_a, "One session batch's starts and draws.")
        .def("arrivals_before", &mooncake::SyntheticAssembly::arrivals_before, "t"_a)
        .def("build",
             [](const mooncake::SyntheticAssembly& a, double horizon, int64_t n_requests) {
                 auto* arrival = new std::vector<double>();
                 nb::capsule own_arrival(arrival, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
                 std::vector<int64_t>* cols[5];
                 nb::capsule owners[5];
                 for (int k = 0; k < 5; ++k) {
                     cols[k] = new std::vector<int64_t>();
                     owners[k] = nb::capsule(cols[k], [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
                 }
                 a.build(horizon, n_requests, *arrival, *cols[0], *cols[1], *cols[2], *cols[3], *cols[4]);
                 using F = nb::ndarray<nb::numpy, double, nb::ndim<1>>;
                 using I = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;
                 auto col = [&](int k) { return I(cols[k]->data(), {cols[k]->size()}, owners[k]); };
                 return nb::make_tuple(F(arrival->data(), {arrival->size()}, own_arrival), col(0), col(1), col(2),
                                       col(3), col(4));
             },
             "horizon"_a, "n_requests"_a,
             "(arrival_s, input_tokens, output_tokens, session_ids, block starts, block ids) of the requests "
             "arriving before horizon, the first n_requests (< 0: all).");

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
        .def_prop_ro("last_index", &RoutingEngine::last_index)
        .def_prop_ro("n_instances", &RoutingEngine::n_instances)
        .def("run",
             [](RoutingEngine& e, const std::string& policy, double threshold, const RngState& s) {
                 Pcg64 rng = rng_from(s);
                 PolicySpec p = spec_of(policy, threshold);
                 {
                     nb::gil_scoped_release release;
                     e.run(p, rng);
                 }
                 return rng_state(rng);
             },
             "policy"_a, "threshold"_a, "rng"_a, "Route every remaining request with a native policy; returns the "
                                                "generator's state after the run.")
        .def("run",
             [](RoutingEngine& e, PolicySpec& p, const RngState& s) {
                 Pcg64 rng = rng_from(s);
                 {
                     nb::gil_scoped_release release;
                     e.run(p, rng);
                 }
                 return rng_state(rng);
             },
             "policy"_a, "rng"_a, "Route every remaining request with the policy (its state, as relsplit's scale, "
                                  "goes on in it); returns the generator's state after the run.")
        .def("decide",
             [](RoutingEngine& e, const std::string& policy, double threshold, Pcg64& rng) {
                 if (e.done()) throw nb::index_error("decide: the trace is exhausted");
                 PolicySpec p = spec_of(policy, threshold);
                 return e.decide(p, rng);
             },
             "policy"_a, "threshold"_a, "rng"_a)
        .def("decide",
             [](RoutingEngine& e, PolicySpec& p, Pcg64& rng) {
                 if (e.done()) throw nb::index_error("decide: the trace is exhausted");
                 return e.decide(p, rng);
             },
             "policy"_a, "rng"_a)
        .def("snapshot", &RoutingEngine::snapshot,
             "A copy of the whole state (an opaque RoutingEngine to pass to restore).")
        .def("restore",
             [](RoutingEngine& e, const RoutingEngine& s) {
                 try {
                     e.restore(s);
                 } catch (const std::invalid_argument& x) {
                     throw nb::value_error(x.what());
                 }
             },
             "snapshot"_a, "Back to the state of a snapshot of this engine.")
        .def("pool_state",
             [](const RoutingEngine& e, double now) { return e.pool_state(now); }, "now"_a,
             "Each instance's queued work at ``now`` (PrefillInstance.queue_s) and its cache's blocks.")
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
                 rows.copy_to(reinterpret_cast<mooncake::Row*>(data));
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

    nb::class_<PolicySpec>(m, "PolicySpec", "A native policy's rule, knobs and running state (engine.hpp).")
        .def("__init__", [](PolicySpec* self, const std::string& name, double threshold) {
                 new (self) PolicySpec(spec_of(name, threshold));
             }, "name"_a, "threshold"_a = 1.0)
        .def_rw("threshold", &PolicySpec::threshold)
        .def_rw("has_long", &PolicySpec::has_long)
        .def_rw("long_s", &PolicySpec::long_s)
        .def_rw("long_instances", &PolicySpec::long_instances)
        .def_rw("work_weight", &PolicySpec::work_weight)
        .def_rw("has_factor", &PolicySpec::has_factor)
        .def_rw("long_factor", &PolicySpec::long_factor)
        .def_rw("min_load", &PolicySpec::min_load)
        .def_rw("decay", &PolicySpec::decay)
        .def_rw("compensated_sum", &PolicySpec::compensated_sum)
        .def_rw("scale_sum", &PolicySpec::scale_sum)
        .def_rw("scale_weight", &PolicySpec::scale_weight)
        .def_rw("load_s", &PolicySpec::load_s)
        .def_prop_rw(
            "knobs", [](const PolicySpec& p) { return p.prod.knobs; },
            [](PolicySpec& p, std::vector<double> k) { p.prod.knobs = std::move(k); },
            "A production router's knobs, in the order of _engine/routing.py PRODUCTION_KNOBS.")
        .def_prop_rw(
            "block_tokens", [](const PolicySpec& p) { return p.prod.block_tokens; },
            [](PolicySpec& p, double b) { p.prod.block_tokens = b; })
        .def_prop_rw(
            "active_flat_limit", [](const PolicySpec& p) { return p.prod.flat_limit; },
            [](PolicySpec& p, int64_t c) { p.prod.flat_limit = c; },
            "Most (block, instance) cells of the flat active-block counts (dynamo, llmd; else hash maps).")
        .def_prop_rw(
            "production_compensated_sum", [](const PolicySpec& p) { return p.prod.compensated_sum; },
            [](PolicySpec& p, bool c) { p.prod.compensated_sum = c; });

    nb::class_<SteppableEnv>(m, "SteppableEnv", "An environment core the native vector env steps (batch.hpp).")
        .def_prop_ro("done", &SteppableEnv::done);

    nb::class_<RoutingEnv, SteppableEnv>(m, "RoutingEnv",
                                         "PrefillRouting-v0's observation, mask and reward on a RoutingEngine.")
        .def("__init__",
             [](RoutingEnv* self, std::shared_ptr<RoutingEngine> e, double time_scale, double slo_s, bool ttft_reward,
                bool allow_pull) {
                 mooncake::RoutingEnvSpec spec{time_scale, slo_s, ttft_reward, allow_pull};
                 new (self) RoutingEnv(std::move(e), spec);
             },
             "engine"_a, "time_scale"_a, "slo_s"_a, "ttft_reward"_a, "allow_pull"_a)
        .def("bind",
             [](RoutingEnv& env, F32Out obs, I8Out mask, F64Out info) {
                 bind_buffers(env, obs, mask, info, env.n_actions(), mooncake::ROUTING_INFO_FIELDS);
             },
             "obs"_a, "mask"_a, "info"_a, nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>(),
             "Write into these buffers from now on (and the pending observation and mask now).")
        .def("observe", &RoutingEnv::observe)
        .def("step",
             [](RoutingEnv& env, int64_t action) {
                 if (env.done()) throw nb::index_error("step: the trace is exhausted");
                 if (action < 0 || action >= env.n_actions()) throw nb::value_error("step: action out of range");
                 bool terminated = false;
                 const double reward = env.step(action, terminated);
                 return nb::make_tuple(reward, terminated, routing_info(env.info));
             },
             "action"_a, "Take the action: (reward, terminated, info) with RoutingSimulator.last's info.");

    // the v1 environments' core (clusterenv.hpp; mooncake_gym/envs/cluster.py)
    using mooncake::ClusterEnvCore;
    auto cluster_env_result = [](ClusterEnvCore& env, double reward, bool terminated) {
        return nb::make_tuple(reward, terminated, cluster_env_info(env.info));
    };
    nb::class_<ClusterEnvCore, SteppableEnv>(m, "ClusterEnvCore",
                                             "The v1 environments' observation, mask, reward and info on a Cluster.")
        .def("__init__",
             [](ClusterEnvCore* self, mooncake::Cluster& cluster, const nb::dict& spec, std::vector<double> predicted) {
                 const mooncake::ClusterEnvSpec s = cluster_env_spec(spec);
                 if (s.prediction && predicted.size() != cluster.outcome().size())
                     throw nb::value_error("predicted: expected one predicted output length per request");
                 new (self) ClusterEnvCore(cluster, s, std::move(predicted));
             },
             "cluster"_a, "spec"_a, "predicted"_a, nb::keep_alive<1, 2>())
        .def_prop_ro("n_obs", &ClusterEnvCore::n_obs)
        .def_prop_ro("n_mask", &ClusterEnvCore::n_mask)
        .def_prop_ro("n_actions", &ClusterEnvCore::n_actions)
        .def_prop_ro("good_tokens", &ClusterEnvCore::good_tokens)
        .def_prop_ro("good_requests", &ClusterEnvCore::good_requests)
        .def("bind",
             [](ClusterEnvCore& env, F32Out obs, I8Out mask, F64Out info) {
                 bind_buffers(env, obs, mask, info, env.n_mask(), mooncake::V1_INFO_FIELDS);
             },
             "obs"_a, "mask"_a, "info"_a, nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>(),
             "Write into these buffers from now on (and the pending observation and mask now).")
        .def("observe", &ClusterEnvCore::observe)
        .def("step",
             [cluster_env_result](ClusterEnvCore& env, int64_t action) {
                 if (env.done()) throw nb::index_error("step: the trace is exhausted");
                 if (action < 0 || action >= env.n_actions()) throw nb::value_error("step: action out of range");
                 bool terminated = false;
                 const double reward = env.step(action, terminated);
                 return cluster_env_result(env, reward, terminated);
             },
             "action"_a, "Take the (flat) action: (reward, terminated, info) with ClusterEnv.step's info.")
        .def("act",
             [cluster_env_result](ClusterEnvCore& env, bool admit, int64_t instance, bool pull, int64_t decode) {
                 if (env.done()) throw nb::index_error("act: the trace is exhausted");
                 bool terminated = false;
                 const double reward = env.act(admit, instance, pull, decode, terminated);
                 return cluster_env_result(env, reward, terminated);
             },
             "admit"_a, "instance"_a, "pull"_a, "decode"_a,
             "Admit (on instance, or the default route if < 0; to decode instance decode, or the default rule's "
             "if < 0 or D) or reject: (reward, terminated, info).");

    nb::class_<EnvBatch>(m, "EnvBatch", "N environment cores stepped in one call (batch.hpp).")
        .def(nb::init<size_t>(), "n"_a)
        .def("set",
             [](EnvBatch& b, size_t i, nb::handle env) {
                 if (i >= b.envs.size()) throw nb::index_error("set: index out of the batch");
                 if (env.is_none()) {
                     b.envs[i] = nullptr;
                     b.owners[i] = nb::none();
                 } else {
                     b.envs[i] = nb::cast<SteppableEnv*>(env);
                     b.owners[i] = nb::borrow(env);
                 }
             },
             "i"_a, "env"_a.none())
        .def("bind",
             [](EnvBatch& b, F64Out rewards, BoolArr terminated, BoolArr truncated, I64Out elapsed, int64_t max_steps,
                std::vector<int> kinds, F64Block floats, I64Block ints, BoolBlock bools) {
                 const size_t n = b.size();
                 if (rewards.shape(0) != n || terminated.shape(0) != n || truncated.shape(0) != n || elapsed.shape(0) != n)
                     throw nb::value_error("bind: expected rewards, terminated, truncated and elapsed of the batch's size");
                 if (max_steps < 0) throw nb::value_error("bind: max_steps: expected >= 0 (0: never truncate)");
                 size_t counts[3] = {0, 0, 0};
                 b.kinds.clear();
                 b.column.clear();
                 for (int k : kinds) {
                     if (k < 0 || k > 2) throw nb::value_error("bind: kinds: expected 0 (float), 1 (int) or 2 (bool)");
                     b.kinds.push_back(static_cast<mooncake::InfoKind>(k));
                     b.column.push_back(counts[k]++);
                 }
                 if (floats.shape(0) < counts[0] || ints.shape(0) < counts[1] || bools.shape(0) < counts[2] ||
                     floats.shape(1) != n || ints.shape(1) != n || bools.shape(1) != n)
                     throw nb::value_error("bind: expected (fields of the kind, n) blocks for the info columns");
                 b.rewards = rewards.data();
                 b.terminated = terminated.data();
                 b.truncated = truncated.data();
                 b.elapsed = elapsed.data();
                 b.max_steps = max_steps;
                 b.floats = floats.data();
                 b.ints = ints.data();
                 b.bools = bools.data();
             },
             "rewards"_a, "terminated"_a, "truncated"_a, "elapsed"_a, "max_steps"_a, "kinds"_a, "floats"_a, "ints"_a,
             "bools"_a, nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>(), nb::keep_alive<1, 5>(),
             nb::keep_alive<1, 8>(), nb::keep_alive<1, 9>(), nb::keep_alive<1, 10>(),
             "Write each step's rewards, flags, step counts (truncating at max_steps > 0) and info columns "
             "(kinds per field: 0 float, 1 int, 2 bool; each kind's fields the rows of its block) into these arrays.")
        .def("step",
             [](EnvBatch& b, I64In actions, std::optional<BoolIn> active, int threads) {
                 if (b.launched_actions) throw nb::value_error("step: a launched step is not finished");
                 const bool* on = b.checked(actions, active);
                 if (threads <= 1) return b.step(actions.data(), on, 1);
                 nb::gil_scoped_release release;
                 return b.step(actions.data(), on, threads);
             },
             "actions"_a, "active"_a.none(), "threads"_a = 1,
             "Step every active env (all with active=None) with its (checked) action into the bound outputs, "
             "on threads threads; returns how many of them ended (terminated or truncated).")
        .def("launch",
             [](EnvBatch& b, I64In actions, std::optional<BoolIn> active, int threads) {
                 if (b.launched_actions) throw nb::value_error("launch: a launched step is not finished");
                 const bool* on = b.checked(actions, active);
                 b.launched_actions = actions;
                 b.launched_active = active;
                 b.launch(actions.data(), on, threads);
             },
             "actions"_a, "active"_a.none(), "threads"_a = 1,
             "step() started on threads worker threads, returning at once: reset envs that are not active "
             "meanwhile (nothing else of the batch), then call finish().")
        .def("finish",
             [](EnvBatch& b) {
                 if (!b.launched_actions) throw nb::value_error("finish: no launched step");
                 size_t ended = 0;
                 std::exception_ptr error;
                 {
                     nb::gil_scoped_release release;
                     try {
                         ended = b.finish();
                     } catch (...) {
                         error = std::current_exception();
                     }
                 }
                 b.launched_actions.reset();
                 b.launched_active.reset();
                 if (error) std::rethrow_exception(error);
                 return ended;
             },
             "Wait for the launched step; returns how many of its envs ended.");

    // ---- OverloadAdmission-v0's core (admission.hpp; the Python side: mooncake_gym/envs/overload_admission.py) ----
    {
        using mooncake::AdmissionEnv;
        static nb::object admission_keys[mooncake::ADMISSION_INFO_FIELDS];
        // OverloadAdmissionEnv.step's info dict from the core's info row
        auto admission_info = [](const double* r) {
            static const char* keys[] = {"index", "admitted", "granted", "doomed_s", "wasted_s", "completed",
                                         "rejected_at_arrival", "rejected_after_prefill"};
            if (!admission_keys[0].is_valid())
                for (int k = 0; k < mooncake::ADMISSION_INFO_FIELDS; ++k)
                    admission_keys[k] = nb::steal(PyUnicode_InternFromString(keys[k]));
            nb::dict d;
            d[admission_keys[0]] = static_cast<int64_t>(r[0]);
            d[admission_keys[1]] = r[1] != 0.0;
            d[admission_keys[2]] = static_cast<int64_t>(r[2]);
            d[admission_keys[3]] = r[3];
            d[admission_keys[4]] = r[4];
            for (int k = 5; k < mooncake::ADMISSION_INFO_FIELDS; ++k) d[admission_keys[k]] = static_cast<int64_t>(r[k]);
            return d;
        };
        nb::class_<AdmissionEnv, SteppableEnv>(m, "AdmissionEnv",
                                               "OverloadAdmission-v0's view, observation, reward and info on a Cluster.")
            .def("__init__",
                 [](AdmissionEnv* self, mooncake::Cluster& cluster, const nb::dict& d, const nb::dict& prefill,
                    std::vector<double> survival) {
                     const char* w = "spec";
                     mooncake::AdmissionSpec s;
                     s.pool_capacity_tokens = mooncake::dict_field<int64_t>(d, "pool_capacity_tokens", w);
                     s.capacity_tokens = mooncake::dict_field<int64_t>(d, "capacity_tokens", w);
                     s.ttft_slo_s = mooncake::dict_field<double>(d, "ttft_slo_s", w);
                     s.recent_window_s = mooncake::dict_field<double>(d, "recent_window_s", w);
                     s.tbt_s = mooncake::dict_field<double>(d, "tbt_s", w);
                     s.oracle = mooncake::dict_field<bool>(d, "oracle", w);
                     s.mean_output_tokens = mooncake::dict_field<double>(d, "mean_output_tokens", w);
                     s.mean_decode_s = mooncake::dict_field<double>(d, "mean_decode_s", w);
                     s.projection_output_tokens = mooncake::dict_field<double>(d, "projection_output_tokens", w);
                     s.ttft_den = mooncake::dict_field<double>(d, "ttft_den", w);
                     s.rejected_den = mooncake::dict_field<double>(d, "rejected_den", w);
                     s.wasted_den = mooncake::dict_field<double>(d, "wasted_den", w);
                     s.in_prefill_den = mooncake::dict_field<double>(d, "in_prefill_den", w);
                     s.log1p_input_cap = mooncake::dict_field<double>(d, "log1p_input_cap", w);
                     s.output_cap = mooncake::dict_field<double>(d, "output_cap", w);
                     s.waste_penalty = mooncake::dict_field<double>(d, "waste_penalty", w);
                     s.mean_prefill_s = mooncake::dict_field<double>(d, "mean_prefill_s", w);
                     try {
                         new (self) AdmissionEnv(cluster, s, prefill_from(prefill), std::move(survival));
                     } catch (const std::invalid_argument& e) {
                         throw nb::value_error(e.what());
                     }
                 },
                 "cluster"_a, "spec"_a, "prefill"_a, "survival"_a, nb::keep_alive<1, 2>(),
                 "The core of the episode on `cluster` (just reset; `prefill`: its instances' prefill time's "
                 "fields): its first view and observation.")
            .def_prop_ro("n_obs", &AdmissionEnv::n_obs)
            .def("prefill_times", &AdmissionEnv::prefill_times,
                 "Each request's prefill time on any instance (LectureAdmission's prefill_s).")
            .def("bind",
                 [](AdmissionEnv& env, F32Out obs, I8Out mask, F64Out info) {
                     bind_buffers(env, obs, mask, info, env.n_actions(), mooncake::ADMISSION_INFO_FIELDS);
                 },
                 "obs"_a, "mask"_a, "info"_a, nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>(),
                 "Write into these buffers from now on (and the pending observation now).")
            .def("observe", &AdmissionEnv::observe)
            .def("step",
                 [admission_info](AdmissionEnv& env, int64_t action) {
                     if (env.done()) throw nb::index_error("step: the trace is exhausted");
                     if (action < 0 || action > 1) throw nb::value_error("step: action out of range");
                     bool terminated = false;
                     const double reward = env.step(action, terminated);
                     return nb::make_tuple(reward, terminated, admission_info(env.info));
                 },
                 "action"_a, "The decision (0 reject, 1 admit): (reward, terminated, info).")
            .def("view",
                 [](const AdmissionEnv& env) {
                     return nb::make_tuple(env.now(), env.index(), nb::tuple(nb::cast(env.queue_s())),
                                           env.prefill_instance(), env.prefill_s(), env.finish(),
                                           env.predicted_ttft_s(), env.recent_rejected(),
                                           env.recent_rejected_after_prefill(), env.recent_wasted_s());
                 },
                 "The pending view's fields: (now, index, prefill_queue_s, prefill_instance, prefill_s, "
                 "predicted_prefill_finish, predicted_ttft_s, recent_rejected, recent_rejected_after_prefill, "
                 "recent_wasted_s).")
            .def("projections", &AdmissionEnv::projections, "at_s"_a, "decode_s"_a,
                 "ClusterSimulator.decode_token_projections(at_s, decode_s) on the engine's state.");
    }
}
