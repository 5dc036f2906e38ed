"""Same numbers, compiled or not: dump the results of a set of runs, then compare another build's.

    python benchmarks/golden.py dump golden.pkl    # e.g. pure Python (make clean-compiled)
    python benchmarks/golden.py check golden.pkl   # e.g. compiled (make install-fast): GOLDEN OK or the runs that differ

The runs: the cluster simulator on the shared trace x2 (kvcentric, and the default router), the
routing simulator on it, the admission problem (early) on ``mooncake-overload`` at load 2, the
``lecture`` preset, an observation mode with noise, and 600 seeded random steps of every v0 and
v1 environment (observations, rewards, infos). Every float is compared by its repr and every
array by its bytes and dtype."""

import pickle
import sys
import traceback
from pathlib import Path

import gymnasium as gym
import numpy as np

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym import conductor, routing
from mooncake_gym.baselines import make_policy
from mooncake_gym.workload import read_trace, synthetic_trace

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "synthetic_trace.jsonl"


def canon(x):
    """A comparable form: arrays -> (dtype, shape, bytes); floats by repr (nan-safe, type kept)."""
    if isinstance(x, np.ndarray):
        return ("nd", str(x.dtype), x.shape, x.tobytes())
    if isinstance(x, np.generic):
        return ("np", type(x).__name__, repr(x.item()))
    if isinstance(x, dict):
        return ("dict", tuple((k, canon(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(canon(v) for v in x))
    if isinstance(x, float):
        return ("float", repr(x))
    if isinstance(x, (int, str, bool, type(None))):
        return (type(x).__name__, repr(x))
    return ("other", type(x).__name__, repr(x))


def cluster_result(r):
    keys = ["outcome", "ttft_s", "tbt_s", "prefill_s", "prefill_instance", "decode_instance", "decode_start_s",
            "end_s", "sample_times_s", "prefill_load", "decode_load", "decode_kv_load", "good", "credited"]
    return {"metrics": r.metrics, **{k: getattr(r, k) for k in keys}}


def routing_result(r):
    keys = ["ttft_s", "prefill_s", "queue_s", "transfer_s", "hit_tokens", "fetched_tokens", "input_tokens",
            "instance", "arrival_s"]
    return {"metrics": r.metrics, **{k: getattr(r, k) for k in keys}}


def env_run(env_id, steps, seed=0, **kw):
    env = gym.make(env_id, **kw).unwrapped
    env.action_space.seed(seed)
    out = []
    obs, info = env.reset(seed=seed)
    out.append(("reset", obs, info))
    s = seed
    for _ in range(steps):
        a = env.action_space.sample()
        obs, rew, term, trunc, info = env.step(a)
        out.append((obs, rew, term, trunc, info))
        if term or trunc:
            s += 1
            obs, info = env.reset(seed=s)
            out.append(("reset", obs, info))
    env.close()
    return out


def runs():
    res = {}
    trace = read_trace(SHARED).scaled(2) if SHARED.exists() else synthetic_trace(0, 8.0)
    res["cluster_shared"] = cluster_result(conductor.simulate(trace, "mooncake", routing=make_policy("routing", "kvcentric")))
    res["cluster_shared_default"] = cluster_result(conductor.simulate(trace, "mooncake"))
    res["routing_shared"] = routing_result(routing.simulate(trace, make_policy("routing", "kvcentric")))
    overload, sat = conductor.overload_workload(synthetic_trace(0, 4.0), 2.0, 3000, seed=1, preset="mooncake-overload")
    res["saturation"] = tuple(sat)
    res["overload_early"] = cluster_result(conductor.simulate(overload, "mooncake-overload", admission=make_policy("admission", "early")))
    res["lecture"] = cluster_result(conductor.simulate(synthetic_trace(0, 4.0).head(600), "lecture",
                                                       routing=make_policy("routing", "kvcentric")))
    res["scraped"] = cluster_result(conductor.simulate(synthetic_trace(1, 6.0).head(600), "mooncake",
                                                       observation="scraped+approximate+noisy", seed=3))
    for env_id in ["mooncake_gym/PrefillRouting-v0", "mooncake_gym/OverloadAdmission-v0",
                   "mooncake_gym/PrefillRouting-v1", "mooncake_gym/OverloadAdmission-v1", "mooncake_gym/Conductor-v1"]:
        res[env_id] = env_run(env_id, 600)
    return res


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    print("compiled:", mooncake_gym.compiled() or "none (pure Python)")
    try:
        got = canon(runs())
    except Exception:
        traceback.print_exc()
        sys.exit(2)
    if mode == "dump":
        pickle.dump(got, open(path, "wb"))
        print("dumped", path)
    else:
        want = pickle.load(open(path, "rb"))
        if got == want:
            print("GOLDEN OK")
        else:
            g, w = dict(got[1]), dict(want[1])
            for k in w:
                if g.get(k) != w[k]:
                    print("GOLDEN DIFF in", k)
            sys.exit(1)
