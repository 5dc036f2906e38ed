// What the native vector environment steps (mooncake_gym/envs/vector.py, docs/engine.md "Vector
// environments"): any environment core that writes its observation, action mask and info row
// into buffers it was given, stepped N at a time in one call, over threads when N is large enough.
// An environment plugs in by deriving from SteppableEnv (the routing env: RoutingEnv in engine.hpp).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
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

// The kind of an info field (the Python class's NATIVE_INFO types).
enum class InfoKind : int8_t { Float = 0, Int = 1, Bool = 2 };

// N environment cores and the vector's per-step outputs: rewards, terminated, truncated, each
// env's step count, and the info rows gathered into one column per field (Gymnasium's vector
// infos: a value per env), split by kind into a float64 (F, N), an int64 (I, N) and a bool (B, N)
// block, so that each column is one contiguous row of its block.
class EnvBatch {
  public:
    explicit EnvBatch(size_t n) : envs(n, nullptr) {}

    std::vector<SteppableEnv*> envs;
    double* rewards = nullptr;
    bool* terminated = nullptr;
    bool* truncated = nullptr;
    int64_t* elapsed = nullptr;
    int64_t max_steps = 0;  // truncate an episode after this many steps (0: never)
    std::vector<InfoKind> kinds;  // per info field
    std::vector<size_t> column;   // per info field: its row in its kind's block
    double* floats = nullptr;
    int64_t* ints = nullptr;
    bool* bools = nullptr;

    size_t size() const { return envs.size(); }

    // Check ``actions`` for the envs with ``active`` set (all when null): every such env has a
    // live core and an action in its range; throws std::invalid_argument naming the env.
    void check(const int64_t* actions, const bool* active) const {
        for (size_t i = 0; i < envs.size(); ++i) {
            if (active && !active[i]) continue;
            if (envs[i] == nullptr || envs[i]->done())
                throw std::invalid_argument("step: env " + std::to_string(i) + " has no core or has terminated");
            if (actions[i] < 0 || actions[i] >= envs[i]->n_actions())
                throw std::invalid_argument("actions: expected integers in 0.." + std::to_string(envs[i]->n_actions() - 1) +
                                            ", got " + std::to_string(actions[i]) + " for env " + std::to_string(i));
        }
    }

    // Env i's info row into the columns, its step count and its truncation.
    void gather(size_t i) {
        const size_t n = envs.size();
        const double* row = envs[i]->info;
        for (size_t k = 0; k < kinds.size(); ++k) {
            const size_t at = column[k] * n + i;
            switch (kinds[k]) {
                case InfoKind::Float: floats[at] = row[k]; break;
                case InfoKind::Int: ints[at] = static_cast<int64_t>(row[k]); break;
                case InfoKind::Bool: bools[at] = row[k] != 0.0; break;
            }
        }
        elapsed[i] += 1;
        truncated[i] = max_steps > 0 && elapsed[i] >= max_steps && !terminated[i];
    }

    // Step envs[i] with actions[i] for every i with active[i] (every i when null; checked first),
    // on ``threads`` threads (contiguous slices; 1: the caller's thread); each env writes only its
    // own buffers and columns, so the slices share nothing. Returns how many stepped envs ended
    // (terminated or truncated).
    size_t step(const int64_t* actions, const bool* active, int threads) {
        const size_t n = envs.size();
        auto slice = [&](size_t lo, size_t hi) {
            for (size_t i = lo; i < hi; ++i)
                if (!active || active[i]) {
                    bool t = false;
                    rewards[i] = envs[i]->step(actions[i], t);
                    terminated[i] = t;
                    gather(i);
                }
        };
        if (threads <= 1 || n < 2) {
            slice(0, n);
        } else {
            const size_t t = static_cast<size_t>(threads) < n ? static_cast<size_t>(threads) : n;
            std::vector<std::thread> pool;
            pool.reserve(t - 1);
            for (size_t k = 1; k < t; ++k) pool.emplace_back(slice, n * k / t, n * (k + 1) / t);
            slice(0, n / t);
            for (std::thread& th : pool) th.join();
        }
        size_t ended = 0;
        for (size_t i = 0; i < n; ++i)
            if ((!active || active[i]) && (terminated[i] || truncated[i])) ++ended;
        return ended;
    }
};

}  // namespace mooncake
