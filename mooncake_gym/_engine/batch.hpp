// What the native vector environment steps (mooncake_gym/envs/vector.py, docs/engine.md "Vector
// environments"): any environment core that writes its observation, action mask and info row
// into buffers it was given, stepped N at a time in one call, over threads when N is large enough.
// An environment plugs in by deriving from SteppableEnv (the routing env: RoutingEnv in engine.hpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

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

// Persistent worker threads for the batch's steps: starting a std::thread costs tens of microseconds,
// more than a step of 16 envs, so the threads are started once and handed each step's tasks.
// run(t, task) runs task(0 .. t-1) once each and returns when all have run; start(t, task) hands
// them out and returns at once, finish() waits for them. The tasks are claimed one at a time from a
// shared counter, by the workers and by the caller's thread in run() and finish() alike, so a worker
// the machine has not scheduled yet leaves its tasks to the others instead of holding the step up.
// Between steps a worker spins for SPIN_US, then sleeps until the next one. In a process forked
// after the threads started there are none: the caller's thread claims every task.
class Workers {
  public:
    // Measured on the 2-core machine at load average 8-9 (vector env of 16 and 64 PrefillRouting-v0
    // envs, 1 vs 2 threads): spinning 50 us made two threads 20-35 % slower than one (the spinning
    // worker takes the core from the stepping thread); 0 or 5 us, about as fast as one.
    static constexpr int SPIN_US = 5;

    Workers() = default;
    Workers(const Workers&) = delete;
    Workers& operator=(const Workers&) = delete;
    ~Workers() {
        if (!threads_.empty() && getpid() != pid_) {  // a forked child: the parent's threads are not here
            // to neither join nor destroy, nor the condition variables they waited on (leaked)
            new std::vector<std::thread>(std::move(threads_));
            sync_.release();
            return;
        }
        try {
            finish();
        } catch (...) {
        }
        {
            std::lock_guard<std::mutex> lock(sync_->mutex);
            stop_ = true;
        }
        claim_.fetch_add(GEN);  // wake the spinning ones
        sync_->wake.notify_all();
        for (std::thread& t : threads_) t.join();
    }

    size_t size() const { return threads_.size(); }

    void run(size_t tasks, const std::function<void(size_t)>& task, size_t workers) {
        start(tasks, task, workers);
        finish();
    }
    // Hand out task(0 .. tasks-1) to ``workers`` threads (started on first use) and the caller's.
    void start(size_t tasks, const std::function<void(size_t)>& task, size_t workers) {
        finish();
        const uint64_t gen = claim_.load() >> 32;
        if (threads_.empty()) pid_ = getpid();
        while (threads_.size() < workers) threads_.emplace_back([this, gen] { loop(gen); });
        // a generation with nothing to claim while the task is written (a worker still in the last
        // generation's help() cannot claim with the new task's count), then the new one
        claim_.store(((gen + 1) << 32) | (GEN - 1));
        task_.store(&task);
        tasks_.store(tasks);
        done_.store(0);
        busy_ = true;
        claim_.store((gen + 2) << 32);
        if (sleepers_.load() > 0) {
            std::lock_guard<std::mutex> lock(sync_->mutex);
            sync_->wake.notify_all();
        }
    }
    // Run the tasks left, wait for the others' (rethrowing the first exception of a task).
    void finish() {
        if (!busy_) return;
        help(claim_.load() >> 32);
        const size_t tasks = tasks_.load();
        spin_until([&] { return done_.load() == tasks; });
        if (done_.load() != tasks) {
            std::unique_lock<std::mutex> lock(sync_->mutex);
            sync_->ended.wait(lock, [&] { return done_.load() == tasks; });
        }
        busy_ = false;
        std::exception_ptr e;
        {
            std::lock_guard<std::mutex> lock(sync_->mutex);
            e = error_;
            error_ = nullptr;
        }
        if (e) std::rethrow_exception(e);
    }

  private:
    static constexpr uint64_t GEN = uint64_t(1) << 32;
    std::vector<std::thread> threads_;
    struct Sync {
        std::mutex mutex;
        std::condition_variable wake, ended;
    };
    std::unique_ptr<Sync> sync_ = std::make_unique<Sync>();
    std::atomic<uint64_t> claim_{0};  // generation << 32 | the next task to claim
    std::atomic<const std::function<void(size_t)>*> task_{nullptr};
    std::atomic<size_t> tasks_{0}, done_{0};
    std::atomic<int> sleepers_{0};
    bool stop_ = false, busy_ = false;
    std::exception_ptr error_;
    pid_t pid_ = 0;  // the process that started the threads

    template <class Ready>
    static void spin_until(Ready ready) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(SPIN_US);
        for (int k = 0; !ready(); ++k)
            if ((k & 63) == 63 && std::chrono::steady_clock::now() >= until) return;
    }

    // Claim and run generation gen's tasks until none is left.
    void help(uint64_t gen) {
        const std::function<void(size_t)>* task = task_.load();
        const size_t tasks = tasks_.load();
        for (;;) {
            uint64_t c = claim_.load();
            do {
                if ((c >> 32) != gen || (c & (GEN - 1)) >= tasks) return;
            } while (!claim_.compare_exchange_weak(c, c + 1));
            try {
                (*task)(static_cast<size_t>(c & (GEN - 1)));
            } catch (...) {
                std::lock_guard<std::mutex> lock(sync_->mutex);
                if (!error_) error_ = std::current_exception();
            }
            if (done_.fetch_add(1) + 1 == tasks) {
                std::lock_guard<std::mutex> lock(sync_->mutex);
                sync_->ended.notify_all();
            }
        }
    }

    void loop(uint64_t seen) {
        for (;;) {
            spin_until([&] { return (claim_.load() >> 32) != seen; });
            if ((claim_.load() >> 32) == seen) {
                std::unique_lock<std::mutex> lock(sync_->mutex);
                sleepers_.fetch_add(1);
                sync_->wake.wait(lock, [&] { return stop_ || (claim_.load() >> 32) != seen; });
                sleepers_.fetch_sub(1);
            }
            {
                std::lock_guard<std::mutex> lock(sync_->mutex);
                if (stop_) return;
            }
            seen = claim_.load() >> 32;
            help(seen);
        }
    }
};

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
    // on ``threads`` threads (1: the caller's thread alone): the envs are split into contiguous
    // slices, TASKS_PER_THREAD per thread, claimed by whichever thread is free (Workers). Each env
    // writes only its own buffers and columns, so the slices share nothing and every env's numbers
    // are the same whatever the number of threads. Returns how many stepped envs ended (terminated
    // or truncated).
    size_t step(const int64_t* actions, const bool* active, int threads) {
        const size_t t = threads > 1 ? static_cast<size_t>(threads) : 1;
        prepare(actions, active, t);
        if (slices_ == 1)
            slice(0);
        else
            workers_.run(slices_, task_, t - 1);
        return ended();
    }
    // The same step started on ``threads`` - 1 worker threads (at least 1), returning at once: the
    // caller may meanwhile reset the envs that are not active (their rows are not touched), then calls
    // finish(), which takes the slices the workers have not, waits, and returns step()'s count.
    void launch(const int64_t* actions, const bool* active, int threads) {
        const size_t t = threads > 1 ? static_cast<size_t>(threads) : 1;
        prepare(actions, active, t);
        workers_.start(slices_, task_, t > 1 ? t - 1 : 1);
    }
    size_t finish() {
        workers_.finish();
        return ended();
    }

  private:
    static constexpr size_t TASKS_PER_THREAD = 4;
    Workers workers_;
    const int64_t* actions_ = nullptr;
    const bool* active_ = nullptr;
    size_t slices_ = 1;
    std::function<void(size_t)> task_ = [this](size_t k) { slice(k); };

    void prepare(const int64_t* actions, const bool* active, size_t threads) {
        const size_t n = envs.size();
        actions_ = actions;
        active_ = active;
        slices_ = threads == 1 ? 1 : (TASKS_PER_THREAD * threads < n ? TASKS_PER_THREAD * threads : (n ? n : 1));
    }
    // slice k of slices_: envs n k / slices_ .. n (k + 1) / slices_
    void slice(size_t k) {
        const size_t n = envs.size();
        const size_t lo = n * k / slices_, hi = n * (k + 1) / slices_;
        for (size_t i = lo; i < hi; ++i)
            if (!active_ || active_[i]) {
                bool t = false;
                rewards[i] = envs[i]->step(actions_[i], t);
                terminated[i] = t;
                gather(i);
            }
    }
    size_t ended() const {
        size_t count = 0;
        for (size_t i = 0; i < envs.size(); ++i)
            if ((!active_ || active_[i]) && (terminated[i] || truncated[i])) ++count;
        return count;
    }
};

}  // namespace mooncake
