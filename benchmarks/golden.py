"""Same numbers before and after a change, compiled or not: dump the results of a set of runs, then
compare another build's (or another commit's) with them.

    python benchmarks/golden.py dump golden.pkl    # e.g. before a refactoring, or pure Python
    python benchmarks/golden.py check golden.pkl   # after it, or compiled: GOLDEN OK or the runs that differ
    python benchmarks/golden.py check golden.pkl --only cli   # the runs whose name starts with "cli"

The runs, about two minutes on two cores:

- the cluster simulator on the shared trace x2 (kvcentric, and the default router), the routing
  simulator on it, the admission problem (early) on ``mooncake-overload`` at load 2, the
  ``lecture`` preset, an observation mode with noise;
- the bounds (``ttft_lower_bound``, ``cluster_ttft_bound``, ``admission_goodput_bound``);
- every command's ``--json`` output, as text: ``trace stats``, ``replay`` and ``overload`` with
  every baseline on the ``lecture`` preset and on each realistic preset, ``cache``, ``lecture``,
  ``compare`` (lecture, ``mooncake``, and every scenario), ``tune`` of a routing and an admission
  rule (its result file);
- seeded random steps of every registered environment and scenario id (observations, rewards,
  infos; a scenario that needs a trace file is skipped).

Every float is compared by its repr and every array by its bytes and dtype."""

import contextlib
import io
import pickle
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np

import mooncake_gym  # noqa: F401  (registers the environments)
from mooncake_gym.analysis import bounds
from mooncake_gym.sim import cluster as conductor
from mooncake_gym.sim import routing
from mooncake_gym.baselines import make_policy
from mooncake_gym.cli import main as cli_main
from mooncake_gym.evaluation.scenarios import SCENARIOS
from mooncake_gym.model.workload import read_trace, synthetic_trace

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


CLI_RUNS = [
    "trace stats synthetic --json",
    "replay --preset lecture --trace synthetic --policy all --json",
    "replay --preset lecture --trace synthetic --policy all --observation scraped --observation noisy --json",
    *(f"replay --trace synthetic --policy all --preset {p} --json"
      for p in ("mooncake", "mooncake-overload", "mooncake-hetero", "h100")),
    "overload --preset lecture --policy all --json",
    "overload --preset lecture --policy all --json --load 3 --requests 500 --seed 2",
    *(f"overload --policy all --preset {p} --requests 400 --json"
      for p in ("mooncake", "mooncake-overload", "mooncake-hetero", "h100")),
    "cache synthetic --blocks 1000,3000 --json",
    "lecture --json",
    "compare --preset lecture --seeds 1 --json",
    "compare --preset mooncake --seeds 1 --json",
    "compare --scenario all --seeds 1 --json",
]
TUNE_RUNS = [
    "tune --policy kvcentric --env routing --budget 2 --search random --seeds 1 --rates 6",
    "tune --policy early --env admission --budget 2 --search random --seeds 1",
    "tune --policy early --env admission --budget 2 --search random --seeds 1 --scenario admission-load2",
]


def cli(command: str) -> str:
    """What ``mooncake-gym COMMAND`` prints on stdout (run in this process), with its exit code."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(command.split())
    return f"exit {code}\n{out.getvalue()}"


def tune_run(command: str) -> str:
    """``tune``'s result file (and stdout) for ``command``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tuned.json"
        printed = cli(f"{command} --out {path} --json")
        return printed + (path.read_text() if path.exists() else "(no file)")


def runs(only: str = ""):
    res = {}
    if only:
        return {k: v for k, v in runs().items() if k.startswith(only)}
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
    small = synthetic_trace(2, 6.0).head(400)
    res["bound_routing"] = bounds.ttft_lower_bound(small)
    res["bound_cluster"] = bounds.cluster_ttft_bound(small)
    res["bound_admission"] = bounds.admission_goodput_bound(overload.head(500))
    for command in CLI_RUNS:
        res["cli " + command] = cli(command)
    for command in TUNE_RUNS:
        res["cli " + command] = tune_run(command)
    for env_id in ["mooncake_gym/PrefillRouting-v0", "mooncake_gym/OverloadAdmission-v0",
                   "mooncake_gym/PrefillRouting-v1", "mooncake_gym/OverloadAdmission-v1", "mooncake_gym/Conductor-v1"]:
        res[env_id] = env_run(env_id, 600)
    for name, scenario in SCENARIOS.items():
        if not scenario.missing():
            res["scenario " + name] = env_run(scenario.env_id, 300, seed=7)
    return res


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    only = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--only" else ""
    warnings.simplefilter("ignore", DeprecationWarning)  # old import paths still answer, and say so
    print("engine:", mooncake_gym.engine())
    try:
        got = canon(runs(only))
    except Exception:
        traceback.print_exc()
        sys.exit(2)
    if mode == "dump":
        pickle.dump(got, open(path, "wb"))
        print("dumped", path)
    else:
        want = pickle.load(open(path, "rb"))
        if only:
            want = ("dict", tuple((k, v) for k, v in want[1] if k.startswith(only)))
        if got == want:
            print("GOLDEN OK")
        else:
            g, w = dict(got[1]), dict(want[1])
            for k in w.keys() | g.keys():
                if g.get(k) != w.get(k):
                    print("GOLDEN DIFF in", k, "(new)" if k not in w else "(missing)" if k not in g else "")
            sys.exit(1)
