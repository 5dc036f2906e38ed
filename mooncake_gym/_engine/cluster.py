"""The cluster simulator on the native engine: :class:`NativeClusterSimulator`, what
``ClusterSimulator(..., engine=)`` and :func:`mooncake_gym.sim.cluster.simulate` run natively.

Native today (docs/engine.md): clusters whose prefill instances serve one request at a time or
batch their queues per iteration up to ``prefill_token_budget`` (chunked prefill, each iteration an
event; ``_engine/batching.hpp``), with or without chunked pipeline parallelism (``pipeline_nodes``)
and KV transfers over shared NICs or each with a whole NIC, on local LRU caches (not the KV store's
SSD tier or global store), and whose decode pool is the ``reserve`` model (the
``lecture`` preset: input + output reserved up front, a fixed time per token) or continuous batching
(the realistic presets' decode: the cost model's step time, the KV copy's tail, the fastest
accepting instance, preemption by abort, recompute or swap; each request's TBT from its token
intervals by the reference's ``tail_means``): every shipped preset as shipped, on the exact view, with a
native default router (``kvcentric``, ``random``, ``load``, ``cache``, or the lecture's
``least_queue``). :meth:`NativeClusterSimulator.run_native` runs whole runs with the native admission rules
(``baseline``, ``early``; or admit-all) and a native routing policy or the default router; the
decode instance is the default rule's. Anything else stays on the reference, :func:`unsupported`
and :func:`policies_unsupported` saying why.

:class:`NativeClusterSimulator` is a :class:`~mooncake_gym.sim.cluster.ClusterSimulator` (its
constructor checks the arguments and computes the workload's columns) whose state is in the engine:
``reset``, ``view``, ``step``, ``apply``, ``done``, ``now`` and ``result`` as the reference's, with
the same numbers (tests/test_engine_cluster.py). Its router's generator is the engine's during the
run and is written back into ``router.rng`` by :meth:`NativeClusterSimulator.result` and
:meth:`NativeClusterSimulator.sync_router`. The decode projections (``view.project_decode``,
``project_decode_tokens``, ``expected_decode_tokens``) read the reference's per-request state and
are not native: on this class they raise, naming ``engine='python'``.
This module is in the simulator's layer (tests/test_layers.py).
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from mooncake_gym._engine import native
from mooncake_gym._engine.routing import (NATIVE_POLICIES, PoolStats, make_engine, native_trace, store_unsupported,
                                          pool_unsupported, prefill_disagrees, prefill_fields, rng_state,
                                          set_rng_state)
from mooncake_gym._engine.stepper import routing_view
from mooncake_gym.model.presets import ClusterPreset, get_preset
from mooncake_gym.sim import cluster as _cluster
from mooncake_gym.sim.cluster import ClusterResult, ClusterSimulator
from mooncake_gym.model.costmodel import NODE_TIER_BANDWIDTH
from mooncake_gym.sim.decode import TBT_TAIL_SHARE, BatchingDecodeInstance, ReservingDecodeInstance
from mooncake_gym.sim.metrics import PENDING
from mooncake_gym.sim.policy import reset_policy
from mooncake_gym.sim.routing import RoutingResult, RoutingSimulator
from mooncake_gym.sim.views import ClusterView, Route

#: The default routers the engine runs: engine.hpp's policies and the lecture's least-queue rule.
#: The routing policies the cluster's engine runs (cluster.cpp router_from): engine.hpp's four rules
#: (sizesplit and relsplit, native in the routing simulator, carry running state the cluster does not).
CLUSTER_POLICIES = {k: v for k, v in NATIVE_POLICIES.items() if v in ("random", "load", "cache", "kvcentric")}
NATIVE_ROUTERS = {**CLUSTER_POLICIES, ("mooncake_gym.sim.policies", "LeastQueue"): "least_queue"}
#: The admission rules the engine runs in :meth:`NativeClusterSimulator.run_native`, by exact class.
NATIVE_ADMISSION = {
    ("mooncake_gym.baselines.admission", "BaselineAdmission"): "baseline",
    ("mooncake_gym.baselines.admission", "EarlyRejection"): "early",
}
#: Python's sum() of floats is compensated from 3.12 on; the engine's sums follow the running one's.
COMPENSATED_SUM = sys.version_info >= (3, 12)
_NO_RNG = (0, 0, 0, 0, False, 0)


def _name(table: dict, policy) -> str | None:
    t = type(policy)
    return table.get((t.__module__, t.__qualname__))


def _qualified(policy) -> str:
    t = type(policy)
    return f"{t.__module__}.{t.__qualname__}"


def _has_pcg64(policy) -> bool:
    rng = getattr(policy, "rng", None)
    return isinstance(rng, np.random.Generator) and rng.bit_generator.state.get("bit_generator") == "PCG64"


#: The constants of CostModel.decode_step_coefficients the engine reads (CostModel.component_coefficients).
DECODE_STEP_FIELDS = ("weights_s", "linear_token_s", "attention_pair_s", "kv_token_s", "elementwise_token_s",
                      "allreduce_fixed_s", "allreduce_token_s", "overhead_s")
#: Batch sizes at which the engine's decode step is checked against the cost model's before a run.
DECODE_PROBES = (0, 1, 2, 7, 64, 256, 4097)


#: Chunks (p, e) of one batched iteration at which the engine's iteration time is checked against
#: PrefillTime's (chunk_compute_s, chunk_attention_s, iteration_s) before a batching run.
ITERATION_PROBES = (((0, 8192),), ((0, 1000), (512, 3000), (16384, 20480)))


def batching_disagrees(f) -> str | None:
    """Why the engine's batched prefill iteration is not ``f``'s (a :class:`PrefillTime`), or None."""
    fields = prefill_fields(f)
    for chunks in ITERATION_PROBES:
        compute = attention = 0.0
        for a, b in chunks:
            compute += f.chunk_compute_s(a, b)
            attention += f.chunk_attention_s(a, b)
        ours = (compute, attention, f.iteration_s(compute, sum(b - a for a, b in chunks), attention))
        if native.prefill_iteration_s(fields, list(chunks)) != ours:
            return (f"engine: the native prefill iteration disagrees with PrefillTime's at chunks {chunks}: port the "
                    f"cost model's change to engine.hpp")
    return None


def preset_unsupported(p: ClusterPreset) -> str | None:
    """Why the engine cannot run preset ``p``'s cluster, or None (a preset is frozen: checked once per
    preset, not at each episode's or run's construction)."""
    try:
        hash(p)
    except TypeError:  # a field that cannot be hashed: checked each time
        return _preset_unsupported(p)
    return _preset_unsupported_once(p)


def _preset_unsupported(p: ClusterPreset) -> str | None:
    why = store_unsupported(p.routing_config())
    if why:
        return f"preset {p.name!r}: {why}"
    if p.prefill_token_budget:
        for c in {c: None for c in p.routing_config().instance_costs(p.prefill_cost)}:
            why = batching_disagrees(c.prefill_time())
            if why:
                return why
    if p.decode_model == "batching":
        co = p.decode_cost.component_coefficients
        if set(co) != set(DECODE_STEP_FIELDS) or any(type(co[k]) is not float for k in DECODE_STEP_FIELDS):
            return f"preset {p.name!r}: decode_cost's step has constants the engine does not know: {sorted(co)}"
        step = decode_step(p)
        for b in DECODE_PROBES:
            if native.decode_step_coefficients(step, b) != p.decode_cost.decode_step_coefficients(b):
                return (f"preset {p.name!r}: the native decode step disagrees with decode_cost."
                        f"decode_step_coefficients({b}): port the cost model's change to decode.hpp")
        return prefill_disagrees(p.decode_cost.prefill_time())
    return None


_preset_unsupported_once = functools.lru_cache(maxsize=64)(_preset_unsupported)


def decode_step(p: ClusterPreset) -> dict:
    """The decode cost model's step constants as the engine reads them."""
    co = p.decode_cost.component_coefficients
    return {k: co[k] for k in DECODE_STEP_FIELDS}


def unsupported(sim: ClusterSimulator, pool: RoutingSimulator) -> str | None:
    """Why the cluster of ``sim`` (constructed, its router reset; ``pool``: its prefill pool as the
    reference builds it) cannot run natively, or None."""
    if native is None:
        return "the native engine is not built"
    why = preset_unsupported(sim.preset)
    if why:
        return why
    if not sim.observation.exact:
        return "the native engine shows the exact view only (observation modes run in Python)"
    router = _name(NATIVE_ROUTERS, sim.router)
    if router is None:
        return (f"router {_qualified(sim.router)} is not native (native: "
                f"{', '.join(sorted(set(NATIVE_ROUTERS.values())))})")
    if router != "least_queue" and not _has_pcg64(sim.router):
        return "the router's generator is not a numpy Generator over PCG64"
    return pool_unsupported(sim.trace, pool.costs, sim._routing_config)


def policies_unsupported(admission, routing, decode) -> str | None:
    """Why :func:`mooncake_gym.sim.cluster.simulate`'s policies cannot run natively, or None."""
    if admission is not None and _name(NATIVE_ADMISSION, admission) is None:
        return (f"admission {_qualified(admission)} is not native (native: "
                f"{', '.join(sorted(NATIVE_ADMISSION.values()))}, or None)")
    if routing is not None:
        if _name(CLUSTER_POLICIES, routing) is None:
            return (f"routing {_qualified(routing)} is not native (native: "
                    f"{', '.join(sorted(set(CLUSTER_POLICIES.values())))}, or None)")
        if not _has_pcg64(routing):
            return "the routing policy's generator is not a numpy Generator over PCG64"
    if decode is not None:
        return f"decode {_qualified(decode)} is not native (the decode rule at the prefill's end is)"
    return None


class _NativeView(ClusterView):
    """A :class:`ClusterView` whose default route is the engine's router's (drawn once per decision)."""

    __slots__ = ()

    def _default(self) -> tuple:
        if self._route is None:
            k, pull, prefill_s, finish = self._sim._cluster.default_route()
            self._route = (Route(k, pull), k, prefill_s, finish)
        return self._route


class _Busy:
    __slots__ = ("busy_until",)

    def __init__(self, busy_until: float):
        self.busy_until = busy_until


class _NetworkTotals:
    """The shared NICs' totals of a :class:`NativeClusterSimulator` (``Network.bytes_sent`` and
    ``transfers``; a copy)."""

    __slots__ = ("bytes_sent", "transfers")

    def __init__(self, totals: tuple):
        self.bytes_sent, self.transfers = totals


class _NativePool:
    """The prefill pool of a :class:`NativeClusterSimulator` as the cluster's callers read it."""

    def __init__(self, sim: "NativeClusterSimulator"):
        self._sim = sim

    @property
    def view(self):
        sim = self._sim
        return None if sim.done else routing_view(sim._pool, sim._routing_output, sim._routing_blocks,
                                                  sim._cache_blocks)

    @property
    def instances(self) -> list:
        """The prefill instances' busy-until times, as objects with ``busy_until`` (a copy)."""
        return [_Busy(b) for b in self._sim._cluster.busy_until()]

    def uncached_prefill_s(self, i: int) -> list[float]:
        return self._sim._routing_ref.uncached_prefill_s(i)

    def result(self, policy: str = "?") -> RoutingResult:
        sim = self._sim
        stats = [PoolStats(b, r) for b, r in zip(sim._pool.busy_s(), sim._pool.requests())]
        return RoutingResult(policy, sim.trace.name, sim._routing_config, sim._pool.rows(), stats,
                             sim.preset.prefill_cost)


def _record(index: int):
    return property(lambda self: self._records()[index])


def _counter(index: int):
    return property(lambda self: self._cluster.counters()[index])


class ClusterSnapshot:
    """An opaque copy of a native cluster's state (:meth:`NativeClusterSimulator.snapshot`)."""

    __slots__ = ("cluster",)

    def __init__(self, cluster):
        self.cluster = cluster


class NativeClusterSimulator(ClusterSimulator):
    """:class:`~mooncake_gym.sim.cluster.ClusterSimulator` with its state in the native engine (see
    the module docstring). Made by ``ClusterSimulator(..., engine="native")`` (or the default where
    the cluster is native); a cluster the engine cannot run turns into the reference at construction
    (``engine=None``) or raises a ``ValueError`` saying why (``engine="native"``)."""

    native = True
    policies_unsupported = staticmethod(policies_unsupported)

    def __init__(self, *args, engine=None, **kwargs):
        self._asked = engine
        self._cluster = None
        super().__init__(*args, **kwargs)  # its checks and columns, then reset()

    def reset(self):
        reset_policy(self.router, self.seed)
        constructing = self._cluster is None
        if constructing:  # the first reset, from the constructor
            pool = RoutingSimulator(self.trace, self._routing_config, self.preset.prefill_cost)
            why = unsupported(self, pool)
            if why is not None:
                if self._asked == "native":
                    raise ValueError(f"engine: 'native' cannot run this cluster: {why}; pass engine='python'")
                self.__class__ = ClusterSimulator  # the reference, from here on
                return ClusterSimulator.reset(self)
            self._build(pool)
        else:
            self._cluster.reset(self._router_rng())
        self._view = None
        self._cached = None
        self._wasted: list = []
        return None if constructing else self.view  # (the constructor drops it: made when first read)

    def _router_rng(self):
        """The router's generator (as reset_policy left it) as the engine's."""
        return native.Pcg64(rng_state(self.router.rng) if _has_pcg64(self.router) else _NO_RNG)

    def _build(self, ref: RoutingSimulator) -> None:
        p = self.preset
        self._routing_name = _name(NATIVE_ROUTERS, self.router)
        self._horizon = self._arrival[-1]
        self._pool = make_engine(ref)
        self._routing_ref = ref  # (its constant per-request prefill times: uncached_prefill_s)
        self._routing_output, self._routing_blocks, self._cache_blocks = ref._output, ref._blocks, ref._cache_blocks
        cap = int(self.decode_capacity_per_instance)
        settings = {"n_decode": p.n_decode, "capacity_tokens": cap, "tbt_s": float(p.tbt_s),
                    "ttft_slo_s": float(p.ttft_slo_s), "tbt_slo_s": float(p.tbt_slo_s),
                    "sample_period_s": self.sample_period_s, "lecture_loads": self._lecture_loads,
                    "refuse_never_fit": self.refuse_never_fit, "compensated_sum": COMPENSATED_SUM,
                    "mean_output_tokens": self.mean_output_tokens, "batching": not self.reserve,
                    "prefill_batching": self._batched}
        if self._batched:  # the engines' prefill mechanisms: chunked batching, and the NICs
            settings.update(prefill_token_budget=int(p.prefill_token_budget), shared_nics=self._shared_nics,
                            pull_kv_bytes_per_token=int(p.prefill_cost.model.kv_bytes_per_token),
                            nic_bandwidth=float(NODE_TIER_BANDWIDTH["rdma"]),
                            pull_latency_s=float(p.prefill_cost.transfer_latency_s), pipeline_nodes=int(p.pipeline_nodes))
            if p.pipeline_nodes > 1:  # each instance's activation send and stage overhead (RoutingSimulator.reset)
                costs = self._routing_config.instance_costs(p.prefill_cost)
                settings.update(pipeline_min_tokens=int(p.pipeline_min_tokens),
                                pipeline_send=[[c.model.d_model * 2 / NODE_TIER_BANDWIDTH["rdma"], c.transfer_latency_s,
                                                c.instance.iteration_overhead_s] for c in costs])
        if not self.reserve:  # the instances as ClusterSimulator.reset builds them, and the KV copy's cost
            d, c = p.decode_cost, p.prefill_cost
            settings.update(check_tbt=self.check_tbt, kv_transfer=self.kv_transfer, idle_step_s=float(self._idle_step_s),
                            kv_bytes_per_token=int(c.model.kv_bytes_per_token),
                            rdma_bandwidth=float(NODE_TIER_BANDWIDTH["rdma"]),
                            transfer_latency_s=float(c.transfer_latency_s), n_layers=int(c.model.n_layers),
                            decode={"step": decode_step(p), "recompute": prefill_fields(d.prefill_time()),
                                    "kv_bytes_per_token": int(d.model.kv_bytes_per_token),
                                    "dram_bandwidth": float(d.instance.tier_bandwidth("dram")),
                                    "capacity_tokens": cap, "max_running": int(p.max_running_cap),
                                    "tbt_slo_s": p.tbt_slo_s * (1 - self.tbt_headroom), "preemption": p.preemption})
        threshold = float(getattr(self.router, "threshold", 1.0)) if self._routing_name == "kvcentric" else 1.0
        self._cluster = native.Cluster(native_trace(self.trace), list(self._output), self._pool, settings,
                                              self._routing_name, threshold, self._router_rng())

    def sync_router(self) -> None:
        """Write the engine's router generator back into ``router.rng`` (the draws made so far)."""
        if self._routing_name != "least_queue":
            set_rng_state(self.router.rng, self._cluster.router_rng().state())

    # -- snapshots ------------------------------------------------------------------------------------
    def snapshot(self) -> "ClusterSnapshot":
        """A copy of the whole simulation state (the engine's cluster and prefill pool: events,
        decode instances, NICs, records, the default router's generator), for :meth:`restore`; the
        trace and the set-up are shared, not copied."""
        return ClusterSnapshot(self._cluster.snapshot())

    def restore(self, snapshot: "ClusterSnapshot") -> ClusterView | None:
        """Back to the state of ``snapshot`` (taken from this simulator; it stays valid for more
        restores); returns the pending view."""
        self.restore_state(snapshot)
        return self.view

    def restore_state(self, snapshot: "ClusterSnapshot") -> None:
        """:meth:`restore` without making the pending view (an environment writes its observation
        from the engine)."""
        if not isinstance(snapshot, ClusterSnapshot):
            raise ValueError(f"snapshot: expected a ClusterSnapshot of this simulator, got {type(snapshot).__name__}")
        self._cluster.restore(snapshot.cluster)
        self._view = None
        self._cached = None
        self._wasted = []  # (re-read from the engine when asked)

    # -- stepping ------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._cluster.done

    @property
    def _done(self) -> bool:
        return self._cluster.done

    @property
    def _i(self) -> int:
        return self._cluster.index

    @property
    def now(self) -> float:
        return self._cluster.now

    @property
    def view(self) -> ClusterView | None:
        if self._view is None and not self._cluster.done:
            v = _NativeView()
            v.now, v.index, v.input_tokens = self._cluster.now, self._i, self._input[self._i]
            v.output_tokens = self._output[v.index] if self.oracle else None
            v.predicted_output_tokens = None if self.predicted_output is None else self.predicted_output[v.index]
            v.routing = self.prefill.view
            v._route = None
            v.decode_capacity_per_instance = self.decode_capacity_per_instance
            v.ttft_slo_s, v.tbt_slo_s = self.preset.ttft_slo_s, self.preset.tbt_slo_s
            v.mean_output_tokens = self.mean_output_tokens
            v.requests_in_prefill, v.requests_in_decode = self._cluster.counters()[8:10]
            v._sim = self
            v._decode = None
            self._view = v
        return self._view

    def apply(self, admit: bool, route: Route | None, decode: int | None) -> None:
        if self._cluster.done:
            raise RuntimeError("step: the workload is exhausted; call reset()")
        self._cluster.apply(admit, -1 if route is None else route[0], False if route is None else route[1],
                            -1 if decode is None else decode)
        self._view = None
        self._cached = None

    def decode_fields(self) -> tuple:
        return self._cluster.decode_fields(self.preset.tbt_s)

    def _mean_decode_s(self) -> float:
        return self._cluster.decode_fields(self.preset.tbt_s)[4]

    # -- the per-request state the decode projections read (the reference's methods run on it) -----
    def _pending(self):
        outcome, _, _, prefill_instance, decode_instance, decode_start = self._records()[:6]
        waiting = outcome == PENDING
        started = ~np.isnan(decode_start)
        # in prefill: admitted, not yet given a decode instance (its KV copy, after the prefill's end, is neither)
        return waiting & started, waiting & ~started & (prefill_instance >= 0) & (decode_instance < 0)

    @property
    def _decode_of(self) -> dict:
        """Request in decode -> (join time, footprint), in the order they joined (the time, then the
        order of their prefills' ends: of their admissions), as the reference's dict."""
        in_decode, _ = self._pending()
        rs = np.flatnonzero(in_decode)
        starts = self._records()[5][rs]
        order = rs[np.lexsort((rs, starts))].tolist()
        start = self._records()[5]
        footprint = self._footprint
        return {r: (float(start[r]), footprint[r]) for r in order}

    @property
    def _in_prefill(self) -> dict:
        """Admitted request whose prefill has not ended -> its prefill end."""
        _, waiting = self._pending()
        finish = self._records()[8]
        return {r: float(finish[r]) for r in np.flatnonzero(waiting).tolist()}

    @property
    def _prefill_fifo(self) -> list:
        """Per prefill instance, its requests' (prefill end, request) in their order (FIFO; under
        batching the reference's order: dispatched with the estimate, moved to the end's place when
        its last iteration is formed)."""
        if self._batched:
            return self._cluster.prefill_fifo()
        fifos: list = [[] for _ in range(self.preset.n_prefill)]
        instance = self._records()[3]
        for r, f in self._in_prefill.items():  # in request order: each instance's FIFO order
            fifos[int(instance[r])].append((f, r))
        return fifos

    # -- the state as the reference's attributes -----------------------------------------------------
    @property
    def prefill(self) -> _NativePool:
        return _NativePool(self)

    @property
    def network(self) -> _NetworkTotals | None:
        """Shared NICs: the transfers' totals so far (None without shared NICs)."""
        return _NetworkTotals(self._cluster.network_totals()) if self._shared_nics else None

    @property
    def decode(self) -> list:
        """The decode instances as the reference's objects (a copy of the engine's state: what a
        projection or the result reads of them)."""
        p = self.preset
        out: list = []
        if self.reserve:
            for j, (u, b) in enumerate(zip(self._cluster.used(), self._cluster.batch())):
                d = ReservingDecodeInstance(j, self.decode_capacity_per_instance, p.tbt_s)
                d.used, d.batch = u, b
                out.append(d)
            return out
        for j in range(p.n_decode):
            d = BatchingDecodeInstance(j, p.decode_cost, self.decode_capacity_per_instance,
                                       p.tbt_slo_s * (1 - self.tbt_headroom), p.max_running_cap, p.preemption)
            for k, v in self._cluster.decoder_state(j).items():
                if k != "n_finished":
                    setattr(d, k, v)
            out.append(d)
        return out

    def _records(self) -> tuple:
        if self._cached is None:
            self._cached = self._cluster.records() + self._cluster.samples()
        return self._cached

    outcome = _record(0)
    ttft_s = _record(1)
    prefill_s = _record(2)
    prefill_instance = _record(3)
    decode_instance = _record(4)
    decode_start_s = _record(5)
    end_s = _record(6)
    tbt_s = _record(7)
    max_interval_s = _record(9)
    mean_interval_s = _record(10)
    _samples_t = _record(11)
    _samples_p = _record(12)
    _samples_d = _record(13)
    _samples_kv = _record(14)
    completed = _counter(0)
    completed_in_ttft_slo = _counter(1)
    admitted = _counter(2)
    rejected_at_arrival = _counter(3)
    rejected_after_prefill = _counter(4)
    refused_too_long = _counter(5)
    granted = _counter(6)
    granted_in_ttft_slo = _counter(7)
    requests_in_prefill = _counter(8)
    requests_in_decode = _counter(9)
    preempted = _counter(10)

    @property
    def wasted_prefill_s(self) -> float:
        return self._cluster.wasted_prefill_s

    @property
    def wasted_log(self) -> list:
        """(time, wasted prefill s) of each rejection after prefill, as the reference's list (kept,
        extended with the engine's new entries when read)."""
        log = self._wasted
        if len(log) < self._cluster.n_wasted:
            log.extend(self._cluster.wasted_log(len(log)))
        return log

    def finish_tbt(self) -> None:
        """ClusterSimulator.finish_tbt: the TBT of each request finished since the last call, from the
        engine's token intervals by the engine's port of the reference's :func:`tail_means` (numpy's
        sort and pairwise sums; the reserve model knows its TBTs at once)."""
        if self.reserve:
            return
        self._cluster.finish_tbt(TBT_TAIL_SHARE)
        self._cached = None

    def result(self, policy: str = "policy") -> ClusterResult:
        self.sync_router()
        return ClusterResult(self, policy)

    def run_native(self, admission, routing) -> None:
        """Every remaining decision by the native rules: ``admission`` (None, ``BaselineAdmission`` or
        ``EarlyRejection``) and ``routing`` (None: the router; or a native routing policy)."""
        rule = "all" if admission is None else _name(NATIVE_ADMISSION, admission)
        slo = self.preset.ttft_slo_s if admission is None or admission.ttft_slo_s is None else admission.ttft_slo_s
        threshold = float(admission.threshold) if rule == "early" else 1.0
        r_name = None if routing is None else _name(CLUSTER_POLICIES, routing)
        r_threshold = float(getattr(routing, "threshold", 1.0)) if r_name == "kvcentric" else 1.0
        r_rng = None if routing is None else native.Pcg64(rng_state(routing.rng))
        after = self._cluster.run(rule, float(slo), threshold, r_name, r_threshold, r_rng)
        if after is not None:
            set_rng_state(routing.rng, after.state())
        self._view = None
        self._cached = None


_cluster.NATIVE = NativeClusterSimulator  # ClusterSimulator(..., engine=) and simulate() construct it
