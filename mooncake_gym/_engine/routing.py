"""The routing simulator on the native engine: what :func:`mooncake_gym.sim.routing.simulate` runs
with ``engine="native"``.

The engine takes the trace as flat columns, each kind of instance's prefill time as the fields of
its :class:`~mooncake_gym.model.costmodel.PrefillTime` (so the cost model's constants come from
Python and only its arithmetic is in C++), the pool's block size and RDMA transfer, and the policy's
generator state (numpy's PCG64, continued exactly in C++ and written back after the run).

Native policies (:data:`NATIVE_POLICIES`): ``random``, ``load``, ``cache``, ``kvcentric``
(any threshold), ``sizesplit`` and ``relsplit`` (any knobs; relsplit's running scale goes in and
comes back out like the generator), and the production routers of ``baselines/production.py``
(:data:`PRODUCTION_KNOBS`; their running state from a fresh ``reset``), recognised by their exact class (a subclass may change the rule: it runs in
Python). Anything else, an observation mode other than the exact view, or a policy generator other
than PCG64 is not native: :func:`unsupported` says why. This module is in the simulator's layer
(tests/test_layers.py); it imports the model layer and the package's engine switch only.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from mooncake_gym._engine import native
from mooncake_gym.model.costmodel import BLOCK_TOKENS, NODE_TIER_BANDWIDTH, PrefillTime

#: The policies the engine runs natively: (module, class) -> the engine's name for the rule.
NATIVE_POLICIES = {
    ("mooncake_gym.baselines.routing", "RandomRouting"): "random",
    ("mooncake_gym.baselines.routing", "LoadBalancing"): "load",
    ("mooncake_gym.baselines.routing", "CacheAware"): "cache",
    ("mooncake_gym.sim.policies", "KVCentric"): "kvcentric",
    ("mooncake_gym.baselines.sizesplit", "SizeSplit"): "sizesplit",
    ("mooncake_gym.baselines.sizesplit", "RelativeSizeSplit"): "relsplit",
    **{("mooncake_gym.baselines.production", cls): name for cls, name in (
        ("DynamoKV", "dynamo"), ("LlmD", "llmd"), ("LlmDPrecise", "llmd_precise"),
        ("SGLangCacheAware", "sglang"), ("VLLMPrefix", "vllm_prefix"), ("VLLMKVAware", "vllm_kvaware"),
        ("AIBrixPrefixCache", "aibrix"), ("PrebleE2", "preble"), ("LMetric", "lmetric"), ("PowerOfTwoChoices", "p2c"),
        ("ConsistentHashBoundedLoad", "chbl"))},
}
#: The production routers' knobs as the engine reads them (production.hpp: ``knob(0)``, ``knob(1)``, ...).
PRODUCTION_KNOBS = {
    "dynamo": ("overlap_weight", "temperature", "credit", "active_request_weight"),
    "llmd": ("prefix_weight", "queue_weight", "kv_weight"),
    "llmd_precise": ("prefix_weight", "queue_weight", "kv_weight"),
    "sglang": ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold"),
    "vllm_prefix": ("min_match_tokens", "window_s"),
    "vllm_kvaware": ("kv_aware_threshold", "window_s"),
    "aibrix": ("imbalance_factor", "imbalance_min_gap", "std_factor"),
    "preble": ("window_s", "rebalance_ratio"),
    "lmetric": (),
    "p2c": ("choices",),
    "chbl": ("balance", "prefix_blocks", "virtual_nodes"),
}
#: Each stateful production router's running state, as its ``reset`` leaves it (None): a native run
#: starts from it and leaves it so (the window or active blocks of the run stay in the engine).
PRODUCTION_STATE = {"dynamo": "_active_blocks", "llmd": "_active_blocks", "llmd_precise": "_active_blocks",
                    "vllm_prefix": "_sent", "vllm_kvaware": "_sent", "preble": "_history"}
#: PrefillTime's fields the engine's prefill time reads, with their Python types (the memo aside).
PREFILL_FIELDS = {
    "n_layers": int, "linear": float, "attention": float, "flops": float, "kv_bytes": int, "bandwidth": float,
    "loads": bool, "overlap": bool, "overhead_s": float, "realistic": bool, "chunk": int, "weights_s": float,
    "step_fixed_s": float, "ar_token_s": float, "attention_efficiency": float, "kv_token_s": float,
    "elementwise_token_s": float,
}


def native_policy(policy) -> str | None:
    """The engine's name for ``policy``'s rule, or None if it is not one of :data:`NATIVE_POLICIES`."""
    t = type(policy)
    return NATIVE_POLICIES.get((t.__module__, t.__qualname__))


def prefill_fields(f: PrefillTime) -> dict:
    """``f``'s constants as the engine reads them; ``ValueError`` naming a field the engine does not
    know (the cost model changed: the engine's prefill time must be ported first)."""
    slots = set(PrefillTime.__slots__) - {"_memo"}
    unknown = slots - set(PREFILL_FIELDS)
    if unknown:
        raise ValueError(f"engine: PrefillTime has fields the native prefill time does not know: {sorted(unknown)}")
    out = {}
    for name, kind in PREFILL_FIELDS.items():
        v = getattr(f, name)
        if type(v) is not kind:
            raise ValueError(f"engine: PrefillTime.{name} is a {type(v).__name__}, the native engine expects {kind.__name__}")
        out[name] = v
    return out


#: (prompt tokens, cached tokens) at which the engine's prefill time is checked against PrefillTime's
#: before a run: no cache, a hit, and several chunks of the realistic model's chunked prefill.
PREFILL_PROBES = ((1000, 0), (1000, 512), (20000, 1536), (9000, 8192))


@functools.lru_cache(maxsize=8)
def prefill_disagrees(f: PrefillTime) -> str | None:
    """Why the engine's prefill time is not ``f``'s (a field it does not know, or another value at
    one of :data:`PREFILL_PROBES`: the cost model changed and the engine's arithmetic must follow),
    or None. The run then stays on the reference. Answered once per ``PrefillTime`` object (its
    constants are a frozen cost model's; an environment's every episode asks again about the same
    one, and the realistic model's probes cost about 0.1 ms in Python)."""
    fields = prefill_fields(f)
    for n, h in PREFILL_PROBES:
        if native.prefill_s(fields, n, h) != f(n, h):
            return (f"engine: the native prefill time disagrees with PrefillTime at ({n}, {h}) tokens "
                    f"({native.prefill_s(fields, n, h)!r} != {f(n, h)!r}): port the cost model's change to engine.hpp")
    return None


def store_unsupported(config) -> str | None:
    """Why the pool's KV store is not native (the engine has LRU DRAM caches only), or None."""
    if config.eviction != "lru":
        return f"the native engine evicts by LRU only (eviction={config.eviction!r} runs in Python)"
    if config.ssd_cache_blocks:
        return "the native engine has no SSD tier (ssd_cache_blocks > 0 runs in Python)"
    if config.kv_store != "local":
        return f"the native engine has local caches only (kv_store={config.kv_store!r} runs in Python)"
    return None


def unsupported(sim, policy) -> str | None:
    """Why ``policy`` on the routing simulator ``sim`` cannot run natively, or None if it can."""
    if native is None:
        return "the native engine is not built"
    if not sim.observation.exact:
        return "the native engine shows the exact view only (observation modes run in Python)"
    return policy_unsupported(policy, len(sim.costs)) or pool_unsupported(sim.trace, sim.costs, sim.config)


def policy_unsupported(policy, n_instances: int) -> str | None:
    """Why ``policy`` cannot make its decisions in the engine on a pool of ``n_instances``, or None."""
    if native_policy(policy) is None:
        t = type(policy)
        return (f"policy {t.__module__}.{t.__qualname__} is not native (native: "
                f"{', '.join(sorted(set(NATIVE_POLICIES.values())))})")
    why = production_unsupported(policy)
    if why:
        return why
    if native_policy(policy) == "p2c" and n_instances > 10000:
        return "p2c: numpy samples more than 10,000 instances by a tail shuffle the engine does not port"
    rng = getattr(policy, "rng", None)
    if not isinstance(rng, np.random.Generator) or rng.bit_generator.state.get("bit_generator") != "PCG64":
        return "the policy's generator is not a numpy Generator over PCG64"
    return None


def production_knobs(policy) -> list[float]:
    """A native production router's knobs as the engine's doubles (:data:`PRODUCTION_KNOBS`)."""
    return [float(getattr(policy, k)) for k in PRODUCTION_KNOBS[native_policy(policy)]]


def production_unsupported(policy) -> str | None:
    """Why a production router (:data:`PRODUCTION_KNOBS`) cannot run on the engine: a knob that is
    not a number a double holds exactly, or running state left from decisions made before (the
    engine starts from the state ``reset`` leaves); None if it can, or if ``policy`` is no production router."""
    name = native_policy(policy)
    if name not in PRODUCTION_KNOBS:
        return None
    for k in PRODUCTION_KNOBS[name]:
        v = getattr(policy, k)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or float(v) != v:
            return f"{name}: knob {k}={v!r} is not a number the engine holds exactly"
    state = PRODUCTION_STATE.get(name)
    if state and getattr(policy, state, None) is not None:
        return f"{name}: the policy holds running state ({state}) from earlier decisions; reset it first"
    return None


def pool_unsupported(trace, costs, config) -> str | None:
    """Why a prefill pool (its instances' ``costs`` and ``config``) on ``trace`` cannot run on the
    engine: its KV store, a prefill time the engine disagrees with, or caches past the engine's
    arrays; None if it can."""
    why = store_unsupported(config)
    if why:
        return why
    try:
        for prefill in {c.prefill_time(): None for c in costs}:
            disagrees = prefill_disagrees(prefill)
            if disagrees:
                return disagrees
    except ValueError as e:
        return str(e)
    cells = native_trace(trace).n_unique * sum(b > 0 for b in config.instance_cache_blocks())
    if cells > MAX_CACHE_CELLS:
        return f"the pool's caches x the trace's distinct blocks ({cells:,}) exceed the engine's {MAX_CACHE_CELLS:,}"
    return None


#: The engine's copies of the last few traces' columns used: {id(blocks): (blocks, native trace)}, blocks being
#: the trace's ``flat_blocks`` where it has them, else its ``block_ids``.
#: Each entry holds the block list it was made from, so the id cannot be reused while it is kept;
#: an entry is used only for that very list (a trace's columns are not changed after it is made).
_TRACES: dict[int, tuple] = {}
_TRACES_KEPT = 8
#: A trace taken from another (``Trace.taken_from``: an episode's draw, a replay's speed-up) at most this
#: many times its length is read from the other's columns, made once (no block id hashed again).
TAKE_FROM_BASE = 8
#: Most (instance with a cache) x (distinct block) pairs the engine's cache arrays hold.
MAX_CACHE_CELLS = 1 << 26


def native_trace(trace):
    """The engine's columns of ``trace`` (flat block ids, mapped to dense indices in C++), made once
    per trace and kept for the next runs on it (tune, compare and the benchmarks rerun one trace)."""
    flat = trace.flat_blocks
    blocks = trace.block_ids if flat is None else flat
    hit = _TRACES.get(id(blocks))
    if hit is not None and hit[0] is blocks and len(hit[1]) == len(trace):
        _TRACES[id(blocks)] = _TRACES.pop(id(blocks))  # the most recently used last: an env's base stays
        return hit[1]
    arrival = np.ascontiguousarray(trace.arrival_s, dtype=np.float64)
    inputs = np.ascontiguousarray(trace.input_tokens, dtype=np.int64)
    taken = trace.taken_from
    if taken is not None and len(taken[0]) <= TAKE_FROM_BASE * len(trace):  # rows of a trace it has (or will keep)
        columns = native.trace_take(native_trace(taken[0]), taken[1], arrival)
    elif flat is None:
        columns = native.Trace.from_blocks(arrival, inputs, blocks)
    else:  # the generator's flat column (no tuples made)
        columns = native.Trace(arrival, inputs, flat[0], flat[1])
    if len(_TRACES) >= _TRACES_KEPT:
        _TRACES.pop(next(iter(_TRACES)))
    _TRACES[id(blocks)] = (blocks, columns)
    return columns


def make_engine(sim):
    """A native ``RoutingEngine`` over ``sim``'s trace, pool and cost models (a
    :class:`~mooncake_gym.sim.routing.RoutingSimulator`, whose constructor checked them)."""
    group, prefill, pool = _pool_setup(tuple(sim.costs))
    return native.RoutingEngine(native_trace(sim.trace), list(sim.config.instance_cache_blocks()), group, prefill, pool)


@functools.lru_cache(maxsize=32)
def _pool_setup(costs: tuple) -> tuple[list, list, dict]:
    """The engine's view of a pool's instance cost models (an environment's every episode, a
    tune's every run): each instance's kind, each kind's prefill fields, the pool's block size and
    RDMA transfer (the cost models are frozen: the same for the same models)."""
    kinds: dict = {}
    group = [kinds.setdefault(c, len(kinds)) for c in costs]  # as PrefixEstimates groups them
    prefill = [prefill_fields(c.prefill_time()) for c in kinds]
    c0 = costs[0]
    pool = {"block_tokens": int(c0.block_tokens), "kv_bytes_per_token": int(c0.model.kv_bytes_per_token),
            "rdma_bandwidth": float(NODE_TIER_BANDWIDTH["rdma"]), "transfer_latency_s": float(c0.transfer_latency_s)}
    return group, prefill, pool


def _split(x: int) -> tuple[int, int]:
    return x >> 64, x & 0xFFFFFFFFFFFFFFFF


def rng_state(rng: np.random.Generator) -> tuple:
    """A PCG64 generator's state as the engine's tuple."""
    s = rng.bit_generator.state
    return (*_split(s["state"]["state"]), *_split(s["state"]["inc"]), bool(s["has_uint32"]), int(s["uinteger"]))


def set_rng_state(rng: np.random.Generator, state: tuple) -> None:
    """Write the engine's generator state back into ``rng`` (the draws the run made, made)."""
    s_hi, s_lo, i_hi, i_lo, has, u = state
    rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": (s_hi << 64) | s_lo, "inc": (i_hi << 64) | i_lo},
                               "has_uint32": int(has), "uinteger": int(u)}


class PoolStats:
    """One instance's totals as ``RoutingResult`` reads them (``busy_s``, ``requests``)."""

    __slots__ = ("busy_s", "requests")

    def __init__(self, busy_s: float, requests: int):
        self.busy_s = busy_s
        self.requests = requests


def policy_spec(policy):
    """The engine's ``PolicySpec`` of a native ``policy``: its rule, its knobs and (relsplit) its
    running scale as they are now."""
    name = native_policy(policy)
    threshold = float(policy.threshold) if name in ("kvcentric", "sizesplit", "relsplit") else 1.0
    spec = native.PolicySpec(name, threshold)
    if name in ("sizesplit", "relsplit"):
        spec.long_instances, spec.work_weight = int(policy.long_instances), float(policy.work_weight)
    if name == "sizesplit":
        spec.has_long = policy.long_s is not None
        spec.long_s = float(policy.long_s) if spec.has_long else 0.0
    if name in PRODUCTION_KNOBS:
        spec.knobs = production_knobs(policy)
        spec.block_tokens = float(BLOCK_TOKENS)
        spec.production_compensated_sum = sys.version_info >= (3, 12)
    if name == "relsplit":
        spec.has_factor = policy.long_factor is not None
        spec.long_factor = float(policy.long_factor) if spec.has_factor else 0.0
        spec.min_load, spec.decay = float(policy.min_load), float(policy.scale.decay)
        spec.scale_sum, spec.scale_weight = float(policy.scale._sum), float(policy.scale._weight)
        spec.load_s = float(policy._load_s)
        spec.compensated_sum = sys.version_info >= (3, 12)  # CPython's sum() of floats is compensated since 3.12
    return spec


def set_policy_state(policy, spec) -> None:
    """Write the engine's running state of a native policy back into ``policy`` (relsplit's scale
    and last load, as the Python run leaves them)."""
    if native_policy(policy) == "relsplit":
        policy.scale._sum, policy.scale._weight, policy._load_s = spec.scale_sum, spec.scale_weight, spec.load_s


def run(sim, policy) -> tuple[np.ndarray, list[PoolStats]]:
    """Route every request of ``sim`` (fresh, exact view) with the native ``policy``: the rows of
    ``RoutingResult`` as an (n, 9) float64 array and each instance's totals. The policy's generator
    (and relsplit's running scale) ends where the Python run would leave it."""
    engine = make_engine(sim)
    spec = policy_spec(policy)
    set_rng_state(policy.rng, engine.run(spec, rng_state(policy.rng)))
    set_policy_state(policy, spec)
    stats = [PoolStats(b, r) for b, r in zip(engine.busy_s(), engine.requests())]
    return engine.rows(), stats
