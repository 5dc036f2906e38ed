// What the native vector environment steps (mooncake_gym/envs/vector.py, docs/engine.md "Vector
// environments"): any environment core that writes its observation, action mask and info row
// into buffers it was given, stepped N at a time in one call, over threads when N is large enough.
// An environment plugs in by deriving from SteppableEnv (the routing env: RoutingEnv in engine.hpp).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

namespace mooncake {

class SteppableEnv {
  public:
    virtual ~SteppableEnv() = default;
    // Take ``action`` (already checked against the action space): write the next observation and
    // action mask and the step's info row into the bound buffers; return the reward.
    virtual double step(int64_t action, bool& terminated) = 0;
    // Whether the episode has ended (a step is then an error: reset first).
    virtual bool done() const = 0;
    // The actions are 0 .. n_actions() - 1.
    virtual int64_t n_actions() const = 0;
    // The bound buffers: obs (float32), mask (int8) and info (float64) rows of the sizes the
    // environment's Python class declares. Null until bound.
    float* obs = nullptr;
    int8_t* mask = nullptr;
    double* info = nullptr;
};

// Step envs[i] with actions[i] for every i with active[i], writing rewards[i] and terminated[i],
// on ``threads`` threads (contiguous slices; 1: the caller's thread). Each env writes only its
// own buffers, so the slices share nothing.
inline void step_batch(const std::vector<SteppableEnv*>& envs, const int64_t* actions, const bool* active,
                       double* rewards, bool* terminated, int threads) {
    const size_t n = envs.size();
    auto slice = [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i)
            if (active[i]) {
                bool t = false;
                rewards[i] = envs[i]->step(actions[i], t);
                terminated[i] = t;
            }
    };
    if (threads <= 1 || n < 2) {
        slice(0, n);
        return;
    }
    const size_t t = static_cast<size_t>(threads) < n ? static_cast<size_t>(threads) : n;
    std::vector<std::thread> pool;
    pool.reserve(t - 1);
    for (size_t k = 1; k < t; ++k) pool.emplace_back(slice, n * k / t, n * (k + 1) / t);
    slice(0, n / t);
    for (std::thread& th : pool) th.join();
}

}  // namespace mooncake
