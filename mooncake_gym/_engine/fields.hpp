// Reading the engine's settings from the dicts the Python side builds (module.cpp's pool and prefill
// times, cluster.cpp's cluster): one field, named in the error when it is missing, and a PrefillTime
// from the fields mooncake_gym/_engine/routing.py exports (PREFILL_FIELDS).
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "engine.hpp"

namespace mooncake {

template <typename T>
T dict_field(const nanobind::dict& d, const char* name, const char* what) {
    if (!d.contains(name))
        throw nanobind::value_error((std::string(what) + ": missing field " + name).c_str());
    return nanobind::cast<T>(d[name]);
}

inline PrefillTime prefill_from(const nanobind::dict& d) {
    const char* w = "prefill";
    PrefillTime p;
    p.n_layers = dict_field<int64_t>(d, "n_layers", w);
    p.linear = dict_field<double>(d, "linear", w);
    p.attention = dict_field<double>(d, "attention", w);
    p.flops = dict_field<double>(d, "flops", w);
    p.kv_bytes = dict_field<int64_t>(d, "kv_bytes", w);
    p.bandwidth = dict_field<double>(d, "bandwidth", w);
    p.loads = dict_field<bool>(d, "loads", w);
    p.overlap = dict_field<bool>(d, "overlap", w);
    p.overhead_s = dict_field<double>(d, "overhead_s", w);
    p.realistic = dict_field<bool>(d, "realistic", w);
    p.chunk = dict_field<int64_t>(d, "chunk", w);
    p.weights_s = dict_field<double>(d, "weights_s", w);
    p.step_fixed_s = dict_field<double>(d, "step_fixed_s", w);
    p.ar_token_s = dict_field<double>(d, "ar_token_s", w);
    p.attention_efficiency = dict_field<double>(d, "attention_efficiency", w);
    p.kv_token_s = dict_field<double>(d, "kv_token_s", w);
    p.elementwise_token_s = dict_field<double>(d, "elementwise_token_s", w);
    if (p.n_layers < 1 || p.chunk < 1) throw nanobind::value_error("prefill: n_layers and chunk must be >= 1");
    return p;
}

}  // namespace mooncake
