"""One disaggregated cluster, three decisions: Mooncake's Conductor (v3 §5-§7) as a simulator.

:class:`ClusterSimulator` runs a prefill pool and a decode pool together. It pauses at every
arriving request with a :class:`ClusterView` and resumes with a :class:`ClusterAction` holding the
three decisions Mooncake's Conductor makes (Algorithm 1):

1. **admission** at arrival: admit, or reject (HTTP 429) before any work is spent;
2. **prefill instance** (and whether to pull the best prefix there first): the prefill pool is
   :class:`mooncake_gym.sim.routing.RoutingSimulator` itself (FIFO instances, local prefix caches,
   KV pull and replication), so routing here gives exactly the routing problem's TTFTs; under the
   realistic presets' engine options (``ClusterPreset.prefill_token_budget``, ``pipeline_nodes``,
   ``shared_nics``; docs/cluster.md, "Engines' mechanisms") each instance batches its queue per
   iteration, each iteration an event here, a long prompt may be pipelined over its group, and KV
   copies share the nodes' NICs (``mooncake_gym.sim.network``); a request's ``ttft_s`` is then the
   estimate at dispatch until its prefill ends;
3. **decode instance**: chosen at arrival by the policy, or (``decode=None``) at the prefill's end
   by the default rule: the instance with the shortest predicted iteration time among those that
   accept the request (the most free KV under the ``reserve`` decode model).

When the prefill ends, the chosen decode instance makes its own admission check (Mooncake's
baseline: "the decode instance double-checks its SLO only after prefill"): room for the request's
KV and, with ``decode_check="tbt"``, a predicted iteration time within the TBT SLO. If it refuses,
the request is *rejected after prefill* and its prefill is wasted. Otherwise its KV is copied over
RDMA (``CostModel.transfer_s``) and it joins the instance's continuous batch
(:mod:`mooncake_gym.sim.decode`). A request whose prompt plus output can never fit in one decode
instance is refused at arrival, without asking the policy, and counted apart (``refused_too_long``;
the trace's output length plays the role of the request's ``max_tokens``, which a server sees).

The routing and admission problems are this simulator with two decisions left to defaults
(``mooncake_gym/PrefillRouting-v1`` owns the prefill instance, ``OverloadAdmission-v1`` the
admission); ``mooncake_gym/Conductor-v1`` owns all three. The lecture's admission problem
(:mod:`mooncake_gym.sim.admission`, ``OverloadAdmission-v0``) is this simulator under the ``lecture``
preset (``cache_blocks=0``) with ``refuse_never_fit=False, kv_transfer=False``, least-queue routing
and the lecture's load series (``load_series="lecture"``).

SLOs and goodput: TTFT = prefill end - arrival (the first token comes from the prefill); TBT = the
mean of the slowest 10 % of a request's token intervals (FAST'25). A request is *good* if it
completes with TTFT <= ``ttft_slo_s`` and TBT <= ``tbt_slo_s``; ``goodput`` counts them and
``goodput_tokens`` their output tokens.

Token goodput without the drain: a finite run ends with a *drain*: after the last arrival no new
request competes, so whatever was admitted and still queued for prefill decodes in an emptying pool
and completes easily. That work is manufactured by the run's end, not earned under the offered load
(a policy that queues more prefill work than the pool can serve would be paid for it). The
*horizon* is the last arrival; ``token_goodput`` counts the output tokens of the good requests that
**started decoding by the horizon** (their KV joined a decode batch at or before it) and
``goodput_requests`` those requests; ``drain_goodput_tokens`` is the rest of ``goodput_tokens`` (good
requests that started decoding after the horizon), shown so that the difference is visible. A
request that started decoding by the horizon counts whole, even if it finishes after it: its decode
slot was won under load. :func:`length_class_of` splits requests by output length
(:data:`LENGTH_CLASSES`); ``accepted_<class>`` is the share of a class's requests counted in
``goodput_requests``, so that a policy that gains by refusing long requests shows it.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
from collections import deque
from typing import Any, Callable, NamedTuple, Union, cast

import numpy as np

from mooncake_gym import _engine
from mooncake_gym._native import mypyc_attr
from mooncake_gym.model.costmodel import NODE_TIER_BANDWIDTH
from mooncake_gym.sim.network import Network
from mooncake_gym.sim.decode import BatchingDecodeInstance, Completion, ReservingDecodeInstance, fastest_accepting, tail_means
from mooncake_gym.sim.observation import as_observation, observation_rng
from mooncake_gym.sim.metrics import (COMPLETED, LENGTH_CLASSES, OUTCOME_NAMES, PENDING, PREEMPTED, REFUSED_TOO_LONG,
                                      REJECTED_AFTER_PREFILL, REJECTED_AT_ARRIVAL, length_class_of, load_correlation,
                                      quantile_table)
from mooncake_gym.sim.policies import KVCentric
from mooncake_gym.sim.policy import feedback_of, policy_name, reset_policy
from mooncake_gym._moved import renamed
from mooncake_gym.model.presets import ClusterPreset, get_preset
from mooncake_gym.sim.routing import RoutingSimulator
from mooncake_gym.sim.views import (ClusterAction, ClusterView, Route, RoutingView, check_admit, check_cluster_action,
                                    check_route)
from mooncake_gym.model.limits import check
from mooncake_gym.model.workload import Trace, resample_iid, synthetic_trace

DEMO3_BASE_RATE = 4.0  # sessions/s of the synthetic base trace (lecture demo 3)
DEMO3_REQUESTS = 6000
DEMO3_LOAD = 2.0

#: A decode instance of either model (the preset's ``decode_model``).
DecodeInstance = Union[BatchingDecodeInstance, ReservingDecodeInstance]

# Event kinds; at equal times: decode events, then prefill ends, then KV arrivals at decode, then
# (batching prefill) pulls arriving at a prefill instance, then prefill iterations starting (after
# the arrivals at that time: an iteration takes what is queued when it starts), then the NICs
_DECODE = 0
_PREFILL_DONE = 1
_JOIN = 2
_PULLED = 3
_ITER = 4
_NET = 5

DECODE_CHECKS = ("tbt", "kv")
#: The load series' definitions: ``"slo"``, Mooncake §7's SLO satisfaction (:class:`ClusterResult`);
#: ``"lecture"``, the lecture's (demo 3): the share of prefill instances busy and the decode pool's
#: KV use (used / capacity).
LOAD_SERIES = ("slo", "lecture")


#: The native engine's cluster simulator (:class:`mooncake_gym._engine.cluster.NativeClusterSimulator`,
#: a subclass of :class:`ClusterSimulator`), set when that module is imported (the package imports it).
NATIVE: Any = None


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (setup.py), it can still be subclassed in Python
class ClusterSimulator:
    """Prefill pool + decode pool of one preset; pauses at every arrival (see the module docstring).

    ::

        sim = ClusterSimulator(trace, "mooncake")
        view = sim.reset()
        while view is not None:
            view = sim.step(ClusterAction(admit=view.predicted_ttft_s <= view.ttft_slo_s))
        sim.result().metrics

    - ``preset``: a name of ``mooncake_gym.model.presets.PRESETS`` or a :class:`ClusterPreset`.
    - ``router``: the default prefill policy (``view -> Route``) used when an action gives no route
      (default: ``kvcentric``, Algorithm 1); it is also what ``view.predicted_ttft_s`` assumes.
    - ``decode_check``: ``"tbt"`` (KV room and predicted iteration time <= TBT SLO) or ``"kv"``.
    - ``tbt_headroom``: the share of the TBT SLO the ``"tbt"`` check keeps free (default 0: a
      request joins if the predicted iteration with it is within the SLO; 0.2: within 80 % of it,
      leaving room for the batch's contexts to grow). ``saturation`` is measured without it.
    - ``refuse_never_fit``: refuse at arrival requests whose input + output exceed one decode
      instance's KV (counted in ``refused_too_long``).
    - ``kv_transfer``: copy the prompt's KV to the decode instance over RDMA before it joins.
    - ``oracle``: show the request's output length in the view.
    - ``predicted_output``: one predicted output length per request of the trace (e.g.
      :func:`mooncake_gym.model.prediction.predict_output_tokens`), shown in the view as
      ``predicted_output_tokens``; None: no prediction.
    - ``sample_period_s``, ``warmup_s``: the load series (every period up to the last arrival) and
      the samples / completions before ``warmup_s`` left out of the correlation and steady rate.
    - ``load_series``: ``"slo"``, Mooncake §7's loads as SLO satisfaction (:class:`ClusterResult`),
      or ``"lecture"``, the lecture's (:data:`LOAD_SERIES`).
    - ``seed``: seeds the default router's tie-breaks (and the observation's noise).
    - ``observation``: what the policies see of the prefill pool (``mooncake_gym.sim.observation``; None
      or ``"exact"``: the exact state). It is the prefill pool's ``RoutingSimulator(observation=,
      rng=)``: ``view.routing``, the default router's choice and ``view.predicted_ttft_s`` come from
      the observed view, while every admitted request is served exactly. Its noise is drawn from a
      generator spawned from ``seed`` (``observation.observation_rng``), anew at each ``reset``.
    - ``engine``: ``"native"`` runs the cluster in the native engine
      (:class:`mooncake_gym._engine.cluster.NativeClusterSimulator`, the same numbers; docs/engine.md
      says which clusters are native) and raises a ``ValueError`` saying why where it cannot;
      ``"python"`` this class; None (default) the native engine where the cluster is native, else
      this class. A subclass of this class is always the reference.
    """

    capacity_tokens = renamed("capacity_tokens", "decode_capacity_per_instance")

    def __new__(cls, *args, engine: str | None = None, **kwargs):
        # engine="native" (or the default where the engine is built): the native engine's simulator,
        # which turns into this class at construction where the cluster is not native (the default)
        # or raises saying why (engine="native"); a subclass is always the reference
        if cls is ClusterSimulator and NATIVE is not None and _engine.resolve(engine) == "native":
            return object.__new__(NATIVE)
        return object.__new__(cls)

    def __getnewargs_ex__(self):
        # pickle and copy make the object with __new__ alone: the reference stays the reference
        return (), {"engine": "python"}

    # (the arguments checked here are not typed: compiled, a type would raise TypeError before the check)
    def __init__(self, trace: Any, preset: str | ClusterPreset = "mooncake", router: Callable | None = None,
                 decode_check: Any = "tbt", refuse_never_fit: Any = True, kv_transfer: Any = True,
                 oracle: Any = False, sample_period_s: Any = 1.0, warmup_s: Any = 30.0, seed: int = 0,
                 observation=None, predicted_output=None, tbt_headroom: Any = 0.0, load_series: Any = "slo",
                 engine: str | None = None):
        if not isinstance(trace, Trace):
            raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
        if len(trace) == 0:
            raise ValueError("trace: expected at least one request")
        if decode_check not in DECODE_CHECKS:
            raise ValueError(f"decode_check: expected one of {DECODE_CHECKS}, got {decode_check!r}")
        for name, v in (("refuse_never_fit", refuse_never_fit), ("kv_transfer", kv_transfer), ("oracle", oracle)):
            if not isinstance(v, bool):
                raise ValueError(f"{name}: expected True or False, got {v!r}")
        for name, seconds in (("sample_period_s", sample_period_s), ("warmup_s", warmup_s)):
            if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0
                    and (seconds > 0 or name == "warmup_s")):
                raise ValueError(f"{name}: expected a finite number of seconds > 0, got {seconds!r}")
        if sample_period_s * 1e6 < trace.arrival_s[-1]:
            raise ValueError(f"sample_period_s: {sample_period_s} s would take more than 10**6 samples over the "
                             f"trace's {trace.arrival_s[-1]:.0f} s")
        self.trace = trace
        self.preset = p = get_preset(preset)
        self.check_tbt = decode_check == "tbt"
        self.decode_check = decode_check
        if not (isinstance(tbt_headroom, (int, float)) and not isinstance(tbt_headroom, bool)
                and 0 <= tbt_headroom < 1):
            raise ValueError(f"tbt_headroom: expected a share of the TBT SLO in [0, 1), got {tbt_headroom!r}")
        self.tbt_headroom = float(tbt_headroom)
        self._ttft_slo_s: float = p.ttft_slo_s
        self.refuse_never_fit = refuse_never_fit
        self.kv_transfer = kv_transfer
        self.oracle = oracle
        if predicted_output is not None:
            predicted_output = np.asarray(predicted_output, dtype=np.float64)
            if predicted_output.shape != (len(trace),) or not np.all(np.isfinite(predicted_output)) \
                    or np.any(predicted_output < 0):
                raise ValueError(f"predicted_output: expected {len(trace)} finite lengths >= 0 (one per request), "
                                 f"got shape {predicted_output.shape}")
            predicted_output = predicted_output.tolist()
        self.predicted_output = predicted_output
        self.sample_period_s = float(sample_period_s)
        if load_series not in LOAD_SERIES:
            raise ValueError(f"load_series: expected one of {LOAD_SERIES}, got {load_series!r}")
        self.load_series = load_series
        self._lecture_loads = load_series == "lecture"
        self.warmup_s = float(warmup_s)
        self.seed = seed
        self.observation = as_observation(observation)
        self.router = KVCentric() if router is None else router
        self._listeners: list[Callable] = []  # the policies' observe (listen), kept across resets
        self.listen(self.router)
        self.decode_capacity_per_instance = p.decode_capacity_per_instance
        self.reserve = p.decode_model == "reserve"
        self._arrival, self._input, self._output, _ = trace.columns()
        self._routing_config = p.routing_config()
        self._batched: bool = p.prefill_token_budget > 0
        self._shared_nics: bool = p.shared_nics
        # the decode footprint the instance checks: the prompt (batching: it grows from there), or
        # the whole reservation (the lecture's model)
        if self.reserve:
            self._footprint = (trace.input_tokens + trace.output_tokens).tolist()
        else:
            self._footprint = self._input
        self._never_fits = ((~p.fits(trace.input_tokens, trace.output_tokens)).tolist() if refuse_never_fit
                            else [False] * len(self._input))
        self._idle_step_s = (p.tbt_s if self.reserve else
                             p.decode_cost.decode_step_s(1, int(np.mean(trace.input_tokens))))
        out = trace.output_tokens  # (int64, as the columns)
        self.mean_output_tokens = float(out.mean())
        self._output_sorted = np.sort(out)
        self._quantile_tables: dict[float, list[int]] = {}
        self._survival: list[float] | None = None
        self.reset()

    def listen(self, policy: Callable) -> None:
        """Tell ``policy`` (if it has ``observe``: :mod:`mooncake_gym.sim.policy`) each admitted
        request's measured TTFT at its prefill's end, as that event happens."""
        observe = feedback_of(policy)
        if observe is not None:
            self._listeners.append(observe)

    # -- state ------------------------------------------------------------------------------------
    def reset(self) -> ClusterView | None:
        """Start over; the view of the first arrival (None if every request is refused)."""
        p = self.preset
        reset_policy(self.router, self.seed)
        self.prefill = RoutingSimulator(self.trace, self._routing_config, p.prefill_cost, self.observation,
                                        None if self.observation.exact else observation_rng(self.seed),
                                        p.prefill_batching(), seed=self.seed)
        # batching prefill: each iteration is an event here (_ITER), so that pulls and copies over
        # the shared NICs (self.network) and the iterations happen in one order of time
        self.prefill.external_clock = self._batched
        self.prefill.defer_pulls = self._batched and self._shared_nics
        self._iterating = [False] * p.n_prefill  # an _ITER event is pending for the instance
        self.network: Network | None = (Network(p.n_prefill + p.n_decode, NODE_TIER_BANDWIDTH["rdma"])
                                        if self._shared_nics else None)
        self._net_version = -1  # the network's version of the pending _NET event
        self.decode: list[DecodeInstance]
        # the decode pool once more under its model's type (the same instances; the other list empty)
        self._reserving: list[ReservingDecodeInstance] = []
        self._batching: list[BatchingDecodeInstance] = []
        if self.reserve:
            self._reserving = [ReservingDecodeInstance(j, self.decode_capacity_per_instance, p.tbt_s)
                               for j in range(p.n_decode)]
            self.decode = list(self._reserving)
        else:
            check_s = p.tbt_slo_s * (1 - self.tbt_headroom)  # x 1.0 exactly without headroom
            self._batching = [BatchingDecodeInstance(j, p.decode_cost, self.decode_capacity_per_instance, check_s,
                                                     p.max_running_cap, p.preemption) for j in range(p.n_decode)]
            self.decode = list(self._batching)
        n = len(self._arrival)
        self._heap: list = []
        self._seq = 0
        self._i = 0
        self._done = False
        self._target: dict[int, int] = {}  # request in prefill -> the decode instance its action chose
        self._in_prefill: dict[int, float] = {}  # request -> prefill end
        self._decode_of: dict[int, tuple[float, int]] = {}  # request in decode -> (join time, footprint)
        self._prefill_fifo: list[deque] = [deque() for _ in range(p.n_prefill)]  # (prefill end, request) per instance
        self._reserved: dict[int, int] = {}
        self.outcome = [PENDING] * n
        self.ttft_s = [math.nan] * n
        self.prefill_s = [math.nan] * n
        self.prefill_instance = [-1] * n
        self.decode_instance = [-1] * n
        self.decode_start_s = [math.nan] * n
        self.end_s = [math.nan] * n
        self.tbt_s = [math.nan] * n
        self.max_interval_s = [math.nan] * n
        self.mean_interval_s = [math.nan] * n
        self.completed = self.completed_in_ttft_slo = self.admitted = 0
        self._tbt_done: dict[int, int] = {}
        self.rejected_at_arrival = self.rejected_after_prefill = self.preempted = self.refused_too_long = 0
        self.wasted_prefill_s = 0.0
        self.granted = self.granted_in_ttft_slo = 0  # requests given a decode slot (with TTFT <= SLO)
        self.wasted_log: list[tuple[float, float]] = []  # (time, wasted prefill s) of each rejection after prefill
        self._samples_t: list[float] = []
        self._samples_p: list[float] = []
        self._samples_d: list[float] = []
        self._samples_kv: list[float] = []
        self._k_sample = 0
        self._next_sample = 0.0
        self._horizon = self._arrival[-1]
        self._view: ClusterView | None = None
        self._advance()
        return self.view

    @property
    def done(self) -> bool:
        return self._done

    @property
    def view(self) -> ClusterView | None:
        """The pending decision's view (None once every request has arrived), made on first read:
        nothing changes the cluster between two decisions, so it is the same whenever it is made."""
        if self._view is None and not self._done:
            self._view = self._make_view(self._i, self._arrival[self._i])
        return self._view

    @property
    def requests_in_prefill(self) -> int:
        """Admitted requests whose prefill has not ended (queued or running)."""
        return len(self._in_prefill)

    @property
    def requests_in_decode(self) -> int:
        """Requests holding a decode slot (their KV joined a batch) that have not finished."""
        return len(self._decode_of)

    @property
    def now(self) -> float:
        return self._arrival[self._i] if self._i < len(self._arrival) else self._horizon

    # -- snapshots ------------------------------------------------------------------------------------
    #: What a snapshot shares with the simulator instead of copying (set at construction, never
    #: changed; the lazily made tables are constants of the trace). The default router and the
    #: listeners stay the same objects: a snapshot holds a copy of the router's attributes instead.
    _SHARED = ("trace", "preset", "router", "_listeners", "observation", "predicted_output", "_routing_config",
               "_arrival", "_input", "_output", "_footprint", "_never_fits", "_output_sorted", "_quantile_tables",
               "_survival")

    def _shared_memo(self) -> dict:
        d = self.__dict__
        shared = [d[k] for k in self._SHARED if k in d]
        shared += [getattr(self.preset, f) for f in self.preset.__dataclass_fields__]  # (the instances' cost models)
        memo = {id(v): v for v in shared}
        memo.update(self.prefill._shared_memo())
        memo[id(self)] = self  # (the pending view's simulator)
        return memo

    def snapshot(self) -> dict:
        """A copy of the whole simulation state (the prefill pool's snapshot included, the decode
        instances, the events, the NICs, the records, the pending view, the default router's
        attributes), for :meth:`restore`: a deep copy of everything but the trace and the set-up
        (the reference's; the native engine's is
        ``mooncake_gym._engine.cluster.NativeClusterSimulator.snapshot``)."""
        state = {k: v for k, v in self.__dict__.items() if k not in self._SHARED}
        state["_router_state"] = getattr(self.router, "__dict__", None)
        return copy.deepcopy(state, self._shared_memo())

    def restore(self, snapshot: dict):
        """Back to the state of ``snapshot`` (from :meth:`snapshot` of this simulator; it stays
        valid for more restores); returns the pending view."""
        if not isinstance(snapshot, dict) or "_router_state" not in snapshot:
            raise ValueError(f"snapshot: expected a snapshot of this simulator, got {type(snapshot).__name__}")
        state = copy.deepcopy(snapshot, self._shared_memo())
        router = state.pop("_router_state")
        if router is not None:
            self.router.__dict__.update(router)
        self.__dict__.update(state)
        return self.view

    # -- stepping -----------------------------------------------------------------------------------
    def step(self, action) -> ClusterView | None:
        """Apply ``action`` (a :class:`ClusterAction`, a tuple ``(admit, route, decode)``, or a bare
        bool = admit with the default route and decode rule) to the pending request; the next view,
        or None once every request has arrived (the remaining work then drains)."""
        if self._done:
            raise RuntimeError("step: the workload is exhausted; call reset()")
        admit, route, decode = self._parse(action)
        self.apply(admit, route, decode)
        return self.view

    def apply(self, admit: bool, route: Route | None, decode: int | None) -> None:
        """``step`` for an already valid action (``admit`` a bool, ``route`` None or a
        ``Route(int, bool)`` in range, ``decode`` None or an instance in range), without making the
        next view: ``view`` makes it when read (the lecture's admission problem reads the cluster's
        state directly and never pays for it). ``done`` says whether a decision is pending."""
        if self._done:
            raise RuntimeError("step: the workload is exhausted; call reset()")
        i = self._i
        prefill = self.prefill
        if not admit:
            self.outcome[i] = REJECTED_AT_ARRIVAL
            self.rejected_at_arrival += 1
            prefill.pass_over()
        else:
            if route is None:  # the default router's answer, checked as the prefill pool's step does
                inst, pull = check_route(cast(ClusterView, self.view).default_route, len(prefill.instances))
                prefill.serve(inst, pull)
            else:  # checked by _parse already
                prefill.serve(route[0], route[1])
            row = prefill._last_row  # (arrival, input, instance, ttft, queue, transfer, prefill, hit, fetched)
            assert row is not None  # set by the dispatch
            k = row[2]
            now = self._arrival[i]
            self.admitted += 1
            self.prefill_instance[i] = k
            self.prefill_s[i] = row[5] + row[6]
            if decode is not None:  # (None, the default rule, is not stored)
                self._target[i] = decode
            if self._batched:  # its first token's time is known once its last iteration is formed (_ITER)
                finish = now + row[3]  # the estimate at dispatch, until then (ttft_s too)
                self.ttft_s[i] = row[3]
                self._in_prefill[i] = finish
                self._prefill_fifo[k].append((finish, i))
                if prefill.pulls:  # its prefix's copy, over the shared NICs
                    net = self.network
                    assert net is not None
                    for r, holder, to, nbytes in prefill.pulls:  # (bytes: the KV store's tiers priced in)
                        net.add(now, holder, to, nbytes, (_PULLED, r, to))
                    prefill.pulls.clear()
                    self._schedule_network()
                if not self._iterating[k]:
                    self._start_iterations(k, now)
            else:
                finish = prefill.instances[k].busy_until
                self.ttft_s[i] = finish - now
                self._in_prefill[i] = finish
                self._prefill_fifo[k].append((finish, i))
                self._seq += 1  # _push(finish, _PREFILL_DONE, i), inlined
                heapq.heappush(self._heap, (finish, _PREFILL_DONE, self._seq, i))
        self._i = i + 1
        self._advance()

    def _parse(self, action) -> tuple[bool, Route | None, int | None]:
        admit: Any  # (not typed by the first unpacking: compiled, that would type-check the later ones)
        route: Any
        decode: Any
        if type(action) is ClusterAction:  # the common case, already in its final types: no conversion
            admit, route, decode = action
            if (admit is True or admit is False) \
                    and (route is None or (type(route) is Route and type(route[0]) is int
                                           and 0 <= route[0] < self.preset.n_prefill and type(route[1]) is bool)) \
                    and (decode is None or (type(decode) is int and 0 <= decode < self.preset.n_decode)):
                return action
        return check_cluster_action(action, self.preset.n_prefill, self.preset.n_decode)

    def _push(self, t: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def _schedule(self, inst) -> None:
        if inst.next_event_s < math.inf:
            self._push(inst.next_event_s, _DECODE, (inst.index, inst.version))

    def _advance(self) -> None:
        """Run events up to the next arrival that needs a decision (refusing never-fitting ones);
        its view is made when read (``view``)."""
        self._view = None
        n = len(self._arrival)
        heap = self._heap
        while self._i < n:
            i = self._i
            now = self._arrival[i]
            if heap and heap[0][0] <= now:
                self._run_until(now)
            if self._never_fits[i]:
                self.outcome[i] = REFUSED_TOO_LONG
                self.refused_too_long += 1
                self.prefill.pass_over()
                self._i += 1
                continue
            if self._next_sample < now:
                self._sample_until(now)
            return
        # every request has arrived: finish the series at the horizon, then drain
        self._sample_until(math.inf)
        self._run_until(math.inf)
        self._done = True

    def _start_iterations(self, k: int, t: float) -> None:
        """Batching prefill: schedule prefill instance ``k``'s next iteration, no earlier than ``t``,
        if a queued prompt is (known to be) ready by then or later."""
        engine = self.prefill.instances[k].engine
        assert engine is not None
        s = engine.next_start()
        if s < math.inf:
            self._iterating[k] = True
            self._seq += 1
            heapq.heappush(self._heap, (s if s > t else t, _ITER, self._seq, k))
        else:
            self._iterating[k] = False

    def _iterate(self, t: float, k: int) -> None:
        """Batching prefill: prefill instance ``k``'s iteration starts at ``t``: formed from what is
        queued (and ready) now; the prompts it ends get their prefill end (TTFT) at its end."""
        engine = self.prefill.instances[k].engine
        assert engine is not None
        s = engine.next_start()
        if s > t:  # nothing ready now (a pull still on its way)
            self._iterating[k] = False
            self._start_iterations(k, t)
            return
        end = self.prefill.form(k, t)
        ends = self.prefill.prefill_ends
        arrival, in_prefill, heap = self._arrival, self._in_prefill, self._heap
        for r, e in ends:
            self.ttft_s[r] = e - arrival[r]
            fifo = self._prefill_fifo[k]
            fifo.remove((in_prefill[r], r))  # the estimate at dispatch replaced by the end, in order of ends
            bisect.insort(fifo, (e, r))
            in_prefill[r] = e
            self._seq += 1
            heapq.heappush(heap, (e, _PREFILL_DONE, self._seq, r))
        ends.clear()
        if engine.waiting:
            self._seq += 1
            heapq.heappush(heap, (end, _ITER, self._seq, k))
        else:
            self._iterating[k] = False

    def _schedule_network(self) -> None:
        """Shared NICs: an event at the network's next drain (one pending at a time, by version)."""
        net = self.network
        assert net is not None
        if net.next_s < math.inf and net.version != self._net_version:
            self._net_version = net.version
            self._seq += 1
            heapq.heappush(self._heap, (net.next_s, _NET, self._seq, net.version))

    def _network_event(self, t: float, version: int) -> None:
        """Shared NICs: transfers drained at ``t``; each arrives a transfer latency later."""
        net = self.network
        assert net is not None
        if version != net.version:
            return  # rates changed since: a later event stands
        latency = self.preset.prefill_cost.transfer_latency_s
        for kind, a, b in net.drained(t):  # a pull arrives a transfer latency after its last byte
            self._seq += 1
            heapq.heappush(self._heap, (t + latency if kind == _PULLED else t, kind, self._seq, (a, b)))
        self._schedule_network()


    def _run_until(self, t: float) -> None:
        heap = self._heap
        pop, push = heapq.heappop, heapq.heappush
        decode = self._batching  # (the reserve model's instances have no events of their own)
        inf = math.inf
        reserve = self.reserve
        while heap and heap[0][0] <= t:
            if heap[0][1] >= _ITER and heap[0][0] == t and t < inf:
                break  # a prefill iteration starting at t waits for the arrivals at t (and the NICs with it)
            te, kind, _, payload = pop(heap)
            if self._next_sample < te:
                self._sample_until(te)
            if kind == _DECODE:
                if reserve:  # a reserving instance's request ends (one event per request)
                    self._release(te, payload)
                    continue
                j, version = payload
                inst = decode[j]
                if inst.version == version:
                    ended = inst.on_event(te)
                    if ended:
                        self._ended(ended)
                    if inst.next_event_s < inf:  # _schedule(inst), inlined
                        self._seq += 1
                        push(heap, (inst.next_event_s, _DECODE, self._seq, (j, inst.version)))
            elif kind == _PREFILL_DONE:
                self._prefill_done(te, payload)
            elif kind == _JOIN:
                r, j = payload
                self._join(r, j, te)
            elif kind == _ITER:
                self._iterate(te, payload)
            elif kind == _PULLED:
                r, k = payload
                self.prefill.pull_arrived(r, k, te)
                if not self._iterating[k]:
                    self._start_iterations(k, te)
            else:
                self._network_event(te, payload)

    def _join(self, r: int, j: int, t: float) -> None:
        """Request ``r``'s KV is on decode instance ``j`` at ``t``: it joins the batch."""
        tokens = self._footprint[r]
        self._decode_of[r] = (t, tokens)
        self.decode_start_s[r] = t
        self.granted += 1
        ttft = self.ttft_s[r]
        if ttft <= self._ttft_slo_s:
            self.granted_in_ttft_slo += 1
        if self.reserve:  # its end is known now: the cluster's own event (_release)
            end = self._reserving[j].hold(tokens, self._output[r], t)
            self._seq += 1
            heapq.heappush(self._heap, (end, _DECODE, self._seq, r))
            return
        inst = self._batching[j]
        reserved = self._reserved
        ended = inst.join(r, t, tokens, self._output[r], self._arrival[r] + ttft, reserved.pop(r, 0) if reserved else 0)
        if ended:
            self._ended(ended)
        self._schedule(inst)

    def _release(self, t: float, r: int) -> None:
        """Request ``r`` ends its decode on a reserving instance at ``t`` (the reserve model)."""
        inst = self._reserving[self.decode_instance[r]]
        inst.release(self._footprint[r])
        self._ended([Completion(r, t, False, inst.tbt_s)])

    def _prefill_done(self, t: float, r: int) -> None:
        del self._in_prefill[r]
        for observe in self._listeners:  # the feedback channel (mooncake_gym.sim.policy)
            observe(r, self.prefill_instance[r], self.ttft_s[r], t)
        fifo = self._prefill_fifo[self.prefill_instance[r]]
        if fifo[0][1] == r:
            fifo.popleft()
        else:  # batching: an instance's prompts may end out of their arrival order (a pull not yet there)
            fifo.remove((t, r))
        tokens = self._footprint[r]
        target = self._target.pop(r, -1) if self._target else -1  # -1: the default rule's choice
        if self.reserve:
            pool = self._reserving
            if target < 0:  # the lecture's rule: the instance with the most free room (the first)
                target, best_used = 0, pool[0].used
                for j in range(1, len(pool)):
                    u = pool[j].used
                    if u < best_used:
                        target, best_used = j, u
            if not pool[target].accepts(tokens):
                target = -1
        elif target < 0:
            target = fastest_accepting(self._batching, tokens, t, self.check_tbt)
        elif not self._batching[target].accepts(tokens, t, self.check_tbt):
            target = -1
        if target < 0:
            self.outcome[r] = REJECTED_AFTER_PREFILL
            self.rejected_after_prefill += 1
            w = self.prefill_s[r]
            self.wasted_prefill_s += w
            self.wasted_log.append((t, w))
            return
        self.decode_instance[r] = target
        if self.kv_transfer and not self.reserve:
            self._batching[target].reserve(tokens)
            self._reserved[r] = tokens
            tail = self._transfer_tail_s(tokens, self.prefill_s[r])
            net = self.network
            if net is not None:  # the tail (its latency's share included) as bytes sharing the two nodes' NICs
                net.add(t, self.prefill_instance[r], self.preset.n_prefill + target, tail * net.bandwidth,
                        (_JOIN, r, target))
                self._schedule_network()
            else:
                self._push(t + tail, _JOIN, (r, target))
        else:  # decode starts at the prefill's end (the lecture's model has no transfer)
            self._join(r, target, t)

    def _transfer_tail_s(self, tokens: int, prefill_s: float) -> float:
        """Time from the prefill's end until the prompt's KV is on the decode instance. Mooncake
        streams the KV layer by layer while prefill computes (v3 §5.2), so only the last layer's
        share of the RDMA copy (``CostModel.transfer_s``), plus whatever of the copy outlasts the
        prefill, comes after its end."""
        copy = self.preset.prefill_cost.transfer_s(tokens)
        layers = self.preset.prefill_cost.model.n_layers
        return (copy - prefill_s if copy > prefill_s else 0.0) + copy / layers

    def _ended(self, completions: list[Completion]) -> None:
        in_decode, end_s, outcome, ttft_s, slo = self._decode_of, self.end_s, self.outcome, self.ttft_s, self._ttft_slo_s
        for c in completions:
            r = c.r
            in_decode.pop(r, None)
            end_s[r] = c.end_s
            if c.preempted:
                outcome[r] = PREEMPTED
                self.preempted += 1
                self.wasted_prefill_s += self.prefill_s[r]
                continue
            outcome[r] = COMPLETED
            self.completed += 1
            if ttft_s[r] <= slo:
                self.completed_in_ttft_slo += 1
            tbt = c.tbt_s
            if tbt is not None:  # known at once (reserve model, or nothing to decode)
                self.tbt_s[r] = self.max_interval_s[r] = self.mean_interval_s[r] = tbt

    def finish_tbt(self) -> None:
        """Compute the TBT of every request finished since the last call (one vectorised pass per
        decode instance; the hot path only records what it needs)."""
        for inst in self.decode:
            if not isinstance(inst, BatchingDecodeInstance):  # the reserve model knows its TBTs at once
                continue
            rows = inst.finished
            done = self._tbt_done.get(inst.index, 0)
            if not rows or done == len(rows):
                continue
            req, offsets, intervals = inst.token_intervals(rows[done:])
            tbt, top, mean = tail_means(offsets, intervals)
            for r, a, b, c in zip(req.tolist(), tbt.tolist(), top.tolist(), mean.tolist()):
                self.tbt_s[r], self.max_interval_s[r], self.mean_interval_s[r] = a, b, c
            self._tbt_done[inst.index] = len(rows)

    # -- load series -------------------------------------------------------------------------------
    def _sample_until(self, t: float) -> None:
        s = self._next_sample
        horizon = self._horizon
        if s >= t or s > horizon:
            return
        period = self.sample_period_s
        prefill = self.prefill.instances
        n_p = len(prefill)
        cap = self.decode_capacity_per_instance * len(self.decode)
        ttft_slo, tbt_slo, per_instance = (self.preset.ttft_slo_s, self.preset.tbt_slo_s,
                                           self.decode_capacity_per_instance)
        n_d = len(self.decode)
        if self._lecture_loads:  # the lecture's: share of prefill instances busy, decode KV use
            while s < t and s <= horizon:
                busy = 0
                for q in prefill:
                    if q.busy_until > s:
                        busy += 1
                kv = sum([d.used_tokens(s) for d in self.decode]) / cap
                self._samples_t.append(s)
                self._samples_p.append(busy / n_p)
                self._samples_d.append(kv)
                self._samples_kv.append(kv)
                self._k_sample += 1
                s = self._k_sample * period
        while s < t and s <= horizon:
            # Mooncake §7's loads, as SLO satisfaction: an instance's queued prefill (the wait a request
            # arriving now would face there) over the TTFT SLO; a decode instance's KV use or its
            # iteration time over the TBT SLO, the greater; each pool's load is its instances' mean
            # (sums of lists, not of generators: mypyc compiles sum(generator) to a loop of +, which on
            # Python >= 3.12 differs from the builtin's compensated float sum)
            queued = sum([q.busy_until - s for q in prefill if q.busy_until > s])
            loads = [d.load(s, 0) for d in self.decode]  # (batch, used, step, _): one context solve each
            self._samples_t.append(s)
            self._samples_p.append(queued / (n_p * ttft_slo))
            self._samples_d.append(sum([max(used / per_instance, step / tbt_slo) for _, used, step, _ in loads]) / n_d)
            self._samples_kv.append(sum(load[1] for load in loads) / cap)
            self._k_sample += 1
            s = self._k_sample * period
        self._next_sample = s if s <= horizon else math.inf  # past the horizon: no more samples, no more calls

    # -- the view -----------------------------------------------------------------------------------
    def _mean_decode_s(self) -> float:
        """The workload's mean decode time as a deployment estimates it: mean output x the mean
        iteration time of the busy decode instances now (one iteration of a lone request if idle)."""
        steps = [s for s in (d.step_s(self.now) for d in self.decode) if s > 0]
        tbt = sum(steps) / len(steps) if steps else self._idle_step_s
        return self.mean_output_tokens * tbt

    def _make_view(self, i: int, now: float) -> ClusterView:
        v = ClusterView()
        v.now, v.index, v.input_tokens = now, i, self._input[i]
        v.output_tokens = self._output[i] if self.oracle else None
        v.predicted_output_tokens = None if self.predicted_output is None else self.predicted_output[i]
        v.routing = cast(RoutingView, self.prefill.view)  # pending: not None
        v._route = None
        v.decode_capacity_per_instance = self.decode_capacity_per_instance
        v.ttft_slo_s, v.tbt_slo_s = self.preset.ttft_slo_s, self.preset.tbt_slo_s
        v.mean_output_tokens = self.mean_output_tokens
        v.requests_in_prefill = len(self._in_prefill)
        v.requests_in_decode = len(self._decode_of)
        v._sim = self
        v._decode = None
        return v

    def decode_fields(self) -> tuple:
        """The decode side of the pending view: (batch, used, step, step with the request, mean
        decode time), computed on first use (a routing-only run never needs them)."""
        now = self.now
        tokens = self._footprint[self._i]
        decode = self.decode
        batch, used, step, step_with = zip(*[d.load(now, tokens) for d in decode])
        return batch, used, step, step_with, self._mean_decode_s()

    def _quantile_table(self, quantile: float) -> list[int]:
        """:func:`mooncake_gym.sim.metrics.quantile_table` of the workload, cached per quantile."""
        table = self._quantile_tables.get(quantile)
        if table is None:
            table = self._quantile_tables[quantile] = quantile_table(self._output_sorted, quantile)
        return table

    def project_decode(self, at_s: float, decode_s: float | None = None, quantile: float | None = None,
                       output_tokens: float | None = None) -> list:
        """See :meth:`ClusterView.project_decode`. Under the ``reserve`` model a request's tokens
        come every ``tbt_s`` from its decode start, so its assumed end is start + the quantile's
        length x ``tbt_s``; under batching it is extrapolated from now at its instance's step time."""
        return self._project_decode(at_s, decode_s, quantile, output_tokens)[0]

    def project_decode_step_s(self, at_s: float, tokens: int, decode_s: float | None = None,
                              output_tokens: float | None = None) -> list | None:
        """Predicted iteration time of each decode instance at ``at_s`` once a request with a prompt
        of ``tokens`` joins it, on the uniform projection of :meth:`project_decode` (Mooncake v3
        §7.4: add the requests whose prefill has finished by ``at_s``, remove those whose decode
        ended before it): the instance's cost model's step time for the projected batch + 1 over the
        projected context + ``tokens``; None for an instance whose KV would not hold them. None under
        the ``reserve`` model (its iteration time is fixed)."""
        if self.reserve:
            return None
        used, batch = self._project_decode(at_s, decode_s, None, output_tokens)
        cap = self.decode_capacity_per_instance
        steps: list[float | None] = []
        for d, u, b in zip(self.decode, used, batch):
            context = u + tokens
            if context + b + 1 > cap:
                steps.append(None)
            else:
                fixed, per_token = cast(BatchingDecodeInstance, d).cost.decode_step_coefficients(b + 1)
                steps.append(fixed + per_token * context)
        return steps

    def _project_decode(self, at_s: float, decode_s: float | None, quantile: float | None,
                        output_tokens: float | None) -> tuple[list, list]:
        """:meth:`project_decode`'s tokens per decode instance and the number of requests each
        holds at ``at_s``."""
        now = self.now
        td = self._mean_decode_s() if decode_s is None else decode_s
        out = self.mean_output_tokens if output_tokens is None else output_tokens
        decode = self.decode
        used: list[Any] = [d.used_tokens(now) for d in decode]  # ints, then + float outputs
        batch = [d.batch for d in decode]
        table = self._quantile_table(quantile) if quantile is not None else None
        n_t = 0 if table is None else len(table)
        tbt = self.preset.tbt_s
        inv_tbt = 1.0 / tbt
        step = [d.step_s(now) or self.preset.tbt_slo_s for d in decode]
        inputs = self._input
        departures: list[tuple[float, Any, int]] = []  # (end, tokens held: int, or with a float output, instance)
        tokens: Any
        instance = self.decode_instance
        for r, (start, held) in self._decode_of.items():
            j = instance[r]
            if table is None:
                end = start + td
            elif self.reserve:
                k = int((now - start) * inv_tbt)
                end = start + (table[k] if k < n_t else k + 1) * tbt
            else:
                k = int((now - start) / step[j]) if step[j] > 0 else 0
                end = now + ((table[k] if k < n_t else k + 1) - k) * step[j]
            if end <= at_s:
                if not self.reserve:  # its prompt and the tokens it has made so far
                    held = inputs[r] + max(0, int((now - start) / step[j]))
                departures.append((end, held, j))
        heapq.heapify(departures)
        arrivals = sorted((f, r) for r, f in self._in_prefill.items() if f <= at_s)
        cap = self.decode_capacity_per_instance
        pop, push = heapq.heappop, heapq.heappush
        for finish, r in arrivals:
            while departures and departures[0][0] <= finish:
                _, tokens, j = pop(departures)
                used[j] -= tokens
                batch[j] -= 1
            tokens = inputs[r] + out
            low = min(used)
            if low + tokens <= cap:
                best = used.index(low)  # the first instance with the fewest tokens
                used[best] = low + tokens
                batch[best] += 1
                if finish + td <= at_s:
                    push(departures, (finish + td, tokens, best))
        while departures and departures[0][0] <= at_s:
            _, tokens, j = pop(departures)
            used[j] -= tokens
            batch[j] -= 1
        return used, batch

    # -- the reserve model's projections of the decode pool's tokens (the lecture's observation) -----
    def _survival_table(self) -> list[float]:
        """``table[k]`` = P(output > k) over the workload, k = 0..max output (built on first use)."""
        if self._survival is None:
            counts = np.bincount(np.asarray(self._output, dtype=np.int64))
            self._survival = (1.0 - np.cumsum(counts) / len(self._output)).tolist()
        return self._survival

    def decode_survival(self, x_s: float) -> float:
        """P(decode time > ``x_s``) over the workload's output lengths (the reserve model's times)."""
        if x_s < 0:
            return 1.0
        k = int(x_s / self.preset.tbt_s)
        s = self._survival_table()
        return s[k] if k < len(s) else 0.0

    def decode_token_projections(self, at_s: float, decode_s: float, output_tokens: float | None = None
                                 ) -> tuple[float, float]:
        """Two projections of the decode pool's tokens at ``at_s`` under the ``reserve`` model, no
        capacity limit applied, in one pass (:meth:`AdmissionView.project_decode_tokens` and
        :meth:`AdmissionView.expected_decode_tokens`): every request decoding ``decode_s`` seconds
        (Mooncake v3 §7.4), and the expectation under the workload's decode-time distribution."""
        # ``x.__trunc__()`` is ``int(x)`` for a float (truncation toward zero) at a third of the
        # cost, and the terms that add nothing or exactly ``tokens`` skip the multiplication; each
        # sum is the same, term for term, in order, as its own loop would make it.
        td = decode_s
        out = self.mean_output_tokens if output_tokens is None else output_tokens
        now = self.now
        surv = self._survival_table()
        n_s = len(surv)
        inv_tbt = 1.0 / self.preset.tbt_s
        uniform = expected = 0.0
        for start, tokens in self._decode_of.values():
            if start + td > at_s:  # Mooncake v3 §7.4: still decoding at at_s if it decodes td seconds
                uniform += tokens
            k_now = ((now - start) * inv_tbt).__trunc__()
            s_now = surv[k_now] if k_now < n_s else 0.0
            if s_now <= 0.0:  # has outlived every decode in the statistics: it is still here
                expected += tokens
                continue
            k_at = ((at_s - start) * inv_tbt).__trunc__()
            if k_at < 0:  # S = 1 before its start: still here
                expected += tokens
            elif k_at < n_s:
                s_at = surv[k_at]
                expected += tokens * (s_at / s_now) if s_at < s_now else tokens
            # else S(at_s - start) = 0: it adds 0.0
        inputs = self._input
        for fifo in self._prefill_fifo:
            for finish, r in fifo:
                if finish > at_s:
                    break
                if finish + td > at_s:
                    uniform += inputs[r] + out
                k = ((at_s - finish) * inv_tbt).__trunc__()
                if k < n_s:
                    expected += (inputs[r] + out) * surv[k]
        return uniform, expected

    # -- results ------------------------------------------------------------------------------------
    def result(self, policy: str = "policy") -> "ClusterResult":
        return ClusterResult(self, policy)


class ClusterResult:
    """Per-request outcomes, load series and metrics of one cluster run.

    Load series, sampled every ``sample_period_s`` up to the last arrival (``sample_times_s``), as
    Mooncake §7 measures load (SLO satisfaction; 1.0 = at the SLO):

    - ``prefill_load``: the mean over prefill instances of the prefill work queued there (the wait a
      request arriving then would face) over the TTFT SLO;
    - ``decode_load``: the mean over decode instances of the greater of KV use (used / capacity) and
      the running iteration's time over the TBT SLO;
    - ``decode_kv_load``: the decode pool's KV occupancy alone (used / capacity; never above 1).

    ``correlation`` (metric ``load_correlation``) is the Pearson correlation of the first two after
    ``warmup_s``; ``prefill_load_std`` the prefill load's swing. Mooncake's Figure 9 shows the two
    swinging in anti-phase under early rejection; here they do where the prefill queue makes
    admission lag decode by about a decode residence (docs/cluster.md, ``tests/test_antiphase.py``).
    """

    #: What the two load series are, for plots.
    LOAD_LABELS = ("prefill load (queued prefill / TTFT SLO)", "decode load (max of KV use, iteration / TBT SLO)")

    def __init__(self, sim: ClusterSimulator, policy: str):
        p = sim.preset
        sim.finish_tbt()
        self.policy = policy
        self.preset = p.name
        self.outcome = np.asarray(sim.outcome, dtype=np.int8)
        self.ttft_s = np.asarray(sim.ttft_s)
        self.tbt_s = np.asarray(sim.tbt_s)
        self.mean_tbt_s = np.asarray(sim.mean_interval_s)  # per request: the mean of its token intervals
        self.prefill_s = np.asarray(sim.prefill_s)
        self.prefill_instance = np.asarray(sim.prefill_instance)
        self.decode_instance = np.asarray(sim.decode_instance)
        self.decode_start_s = np.asarray(sim.decode_start_s)
        self.end_s = np.asarray(sim.end_s)
        self.sample_times_s = np.asarray(sim._samples_t)
        self.prefill_load = np.asarray(sim._samples_p)
        self.decode_load = np.asarray(sim._samples_d)
        self.decode_kv_load = np.asarray(sim._samples_kv)
        steady = self.sample_times_s >= sim.warmup_s
        self.correlation = load_correlation(self.prefill_load[steady], self.decode_load[steady])
        self.prefill_load_std = float(self.prefill_load[steady].std()) if steady.any() else float("nan")
        done = self.outcome == COMPLETED
        prefilled = ~np.isnan(self.ttft_s)
        ttft = self.ttft_s[prefilled]
        tbt = self.tbt_s[done]
        horizon = sim._horizon
        span = horizon - sim.warmup_s
        starts = self.decode_start_s[done]
        #: the prefill pool's records: one row per prefilled request, in order of arrival
        self.prefill_result = sim.prefill.result(policy)
        routing = self.prefill_result.metrics

        def pct(x):  # the 50th, 90th and 99th percentiles in one call
            return np.percentile(x, [50, 90, 99]).tolist() if len(x) else [float("nan")] * 3

        ttft_pct, tbt_pct = pct(ttft), pct(tbt)

        output = sim.trace.output_tokens  # (int64, the simulator's _output)
        good = done & (self.ttft_s <= p.ttft_slo_s) & (self.tbt_s <= p.tbt_slo_s)
        self.good = good
        n_int = np.maximum(output[done] - 1, 0)
        mean_interval = (float((self.mean_tbt_s[done] * n_int).sum() / n_int.sum())
                         if n_int.sum() else float("nan"))
        # without the drain: good requests that started decoding by the horizon (module docstring)
        credited = good & (self.decode_start_s <= horizon)
        self.credited = credited
        classes = length_class_of(output)
        self.metrics = {
            "policy": policy,
            "preset": p.name,
            "requests": len(self.outcome),
            "admitted": sim.admitted,
            "completed": sim.completed,
            "goodput": int(good.sum()),
            "goodput_tokens": int(output[good].sum()),
            "output_tokens_served": int(output[done].sum()),
            "rejected_at_arrival": sim.rejected_at_arrival,
            "rejected_after_prefill": sim.rejected_after_prefill,
            "preempted": sim.preempted,
            "refused_too_long": sim.refused_too_long,
            "wasted_prefill_s": sim.wasted_prefill_s,
            "wasted_prefill_gpu_s": sim.wasted_prefill_s * p.prefill_cost.instance.n_gpus,
            "mean_ttft_s": float(ttft.mean()) if len(ttft) else float("nan"),
            "p50_ttft_s": ttft_pct[0],
            "p90_ttft_s": ttft_pct[1],
            "p99_ttft_s": ttft_pct[2],
            "ttft_attainment": float((ttft <= p.ttft_slo_s).mean()) if len(ttft) else float("nan"),
            "mean_tbt_s": float(tbt.mean()) if len(tbt) else float("nan"),
            "p50_tbt_s": tbt_pct[0],
            "p90_tbt_s": tbt_pct[1],
            "p99_tbt_s": tbt_pct[2],
            "tbt_attainment": float((tbt <= p.tbt_slo_s).mean()) if len(tbt) else float("nan"),
            "mean_token_interval_s": mean_interval,
            "hit_ratio": routing["hit_ratio"],
            "fetched_tokens": routing["fetched_tokens"],
            "load_correlation": self.correlation,
            "mean_prefill_load": float(self.prefill_load.mean()) if len(self.prefill_load) else float("nan"),
            "mean_decode_load": float(self.decode_load.mean()) if len(self.decode_load) else float("nan"),
            "prefill_load_std": self.prefill_load_std,
            "duration_s": horizon,
            "goodput_per_s": int(good.sum()) / horizon if horizon > 0 else float("nan"),
            "steady_completed_per_s": (float(np.count_nonzero((starts >= sim.warmup_s) & (starts <= horizon))) / span
                                       if span > 0 else float("nan")),
            "token_goodput": int(output[credited].sum()),
            "good_requests": int(credited.sum()),
            "drain_good_requests": int((good & ~credited).sum()),
            "drain_token_goodput": int(output[good & ~credited].sum()),
        }
        # the old names, kept for JSON readers (docs/metrics.md): goodput and goodput_tokens
        # count the drain too (good_requests + drain_good_requests, and their tokens)
        self.metrics["goodput_requests"] = self.metrics["good_requests"]
        self.metrics["drain_goodput_tokens"] = self.metrics["drain_token_goodput"]
        for k, (name, _, _) in enumerate(LENGTH_CLASSES):
            members = classes == k
            n = int(members.sum())
            self.metrics[f"accepted_{name}"] = float(credited[members].sum() / n) if n else float("nan")
        if p.preemption != "abort":  # the engines' preemption (re-queued, not aborted): what it cost
            batching = [d for d in sim.decode if isinstance(d, BatchingDecodeInstance)]
            self.metrics["preemptions"] = sum(d.preemptions for d in batching)
            self.metrics["preemption_stall_s"] = float(sum([d.preemption_stall_s for d in batching]))
            self.metrics["recomputed_tokens"] = sum(d.recomputed_tokens for d in batching)


def simulate(trace: Trace, preset: str | ClusterPreset = "mooncake", admission: Callable | None = None,
             routing: Callable | None = None, decode: Callable | None = None, seed: int = 0,
             engine: str | None = None, **options) -> ClusterResult:
    """Run one cluster over ``trace``: ``admission(view) -> bool`` (default: admit all),
    ``routing(routing_view) -> Route`` (default: the simulator's router, ``kvcentric``),
    ``decode(view) -> instance or None`` (default: the rule at the prefill's end). ``options`` go to
    :class:`ClusterSimulator`. Each policy's ``reset(rng)`` is called first with ``seed``.

    ``engine``: ``"native"`` runs the whole loop in the native engine (the cluster and the policies
    native: docs/engine.md; else a ``ValueError`` saying why), ``"python"`` this module; None
    (default) the native engine where the run is native and this module otherwise. Both give the
    same numbers (tests/test_engine_cluster.py)."""
    for name, pol in (("admission", admission), ("routing", routing), ("decode", decode)):
        if pol is not None and not callable(pol):
            raise ValueError(f"{name}: expected a callable policy or None, got {type(pol).__name__}")
        if pol is not None:
            reset_policy(pol, seed)
    names = [policy_name(p) for p in (admission, routing, decode) if p is not None]
    if NATIVE is not None and _engine.resolve(engine) == "native":
        why = NATIVE.policies_unsupported(admission, routing, decode)
        if why is None:
            sim = ClusterSimulator(trace, preset, seed=seed, engine=engine, **options)
            if getattr(sim, "native", False):
                sim.run_native(admission, routing)
                return sim.result("+".join(names) or "default")
        elif engine == "native":
            raise ValueError(f"engine: 'native' cannot run this: {why}; pass engine='python'")
        else:
            engine = "python"
    sim = ClusterSimulator(trace, preset, seed=seed, engine=engine, **options)
    for pol in (admission, routing, decode):
        if pol is not None:
            sim.listen(pol)
    view = sim.view
    while view is not None:
        admit = True if admission is None else check_admit(admission(view))
        route = None if routing is None or not admit else routing(view.routing)
        target = None if decode is None or not admit else decode(view)
        view = sim.step(ClusterAction(admit, route, target))
    return sim.result("+".join(names) or "default")


# ------------------------------------------------------------------------------------------------
# Load: multiples of the cluster's measured saturation throughput
# ------------------------------------------------------------------------------------------------
class Saturation(NamedTuple):
    """Requests/s each pool completes with an infinite backlog of the request mix, admit-all, in
    steady state; ``cluster_per_s`` is the smaller and ``bottleneck`` names that pool."""

    prefill_per_s: float
    decode_per_s: float
    cluster_per_s: float
    bottleneck: str


_SATURATION_CACHE: dict = {}


def saturation(trace: Trace, preset: str | ClusterPreset = "mooncake", decode_check: str = "tbt",
               n_requests: int = 4000) -> Saturation:
    """The saturation throughput of ``preset``'s cluster on ``trace``'s request mix (cached).

    - Prefill: every request of the mix queued at time 0 and routed by Algorithm 1 (``kvcentric``,
      prefix caches and pulls included); the rate is the requests over the makespan.
    - Decode: the decode pool alone fed from an infinite backlog of the requests (in trace order,
      repeated up to ``n_requests``): whenever an instance accepts the next request (its own check,
      ``decode_check``) it joins; the rate is the completions per second between the first and the
      last quarter of them. Under the ``reserve`` model (the lecture's pool) this is the lecture's
      pool exactly (:func:`_reserve_decode_rate`): whole requests packed as they come, so it is
      below the model's closed form :func:`decode_capacity_rate` (a fluid bound: the pool's KV
      always full) by the room left between requests and behind a request that does not fit yet.
    """
    p = get_preset(preset)
    key = (id(trace), len(trace), float(trace.arrival_s[-1]), p, decode_check, n_requests)
    hit = _SATURATION_CACHE.get(key)
    if hit is not None:
        return hit
    inputs = trace.input_tokens.tolist()
    outputs = trace.output_tokens.tolist()
    # prefill: every request of the mix queued at once, routed by Algorithm 1 (prefix caches and
    # pulls included): the pool's rate is the requests over the time the last one finishes
    backlog = trace.take(range(len(trace)), arrival_s=np.zeros(len(trace)))
    pool_sim = RoutingSimulator(backlog, p.routing_config(), p.prefill_cost, batching=p.prefill_batching())
    router = KVCentric()
    view = pool_sim.view
    while view is not None:
        view = pool_sim.step(router(view))
    pool_sim.finish()  # batching: the iterations still to form
    prefill_rate = len(trace) / max(inst.busy_until for inst in pool_sim.instances)
    cap = p.decode_capacity_per_instance
    mix = [(i, o) for i, o in zip(inputs, outputs) if i + o <= cap]
    if not mix:
        raise ValueError("trace: no request fits in one decode instance")
    if p.decode_model == "reserve":  # the lecture's pool, measured as the batching one is
        decode_rate = _reserve_decode_rate(p, mix, n_requests)
    else:
        decode_rate = _batching_decode_rate(p, mix, decode_check == "tbt", n_requests)
    result = Saturation(prefill_rate, decode_rate, min(prefill_rate, decode_rate),
                        "prefill" if prefill_rate < decode_rate else "decode")
    _SATURATION_CACHE[key] = result
    return result


def _batching_decode_rate(p: ClusterPreset, mix: list, check_tbt: bool, n_requests: int) -> float:
    """Completions per second of ``p``'s batching decode pool fed from an infinite backlog of ``mix``
    ((input, output) pairs, repeated up to ``n_requests``), between the first and the last quarter."""
    pool = [BatchingDecodeInstance(j, p.decode_cost, p.decode_capacity_per_instance, p.tbt_slo_s, p.max_running_cap, p.preemption)
            for j in range(p.n_decode)]
    ends: list[float] = []
    heap: list = []
    nxt = 0
    now = 0.0

    def fill(inst):
        nonlocal nxt
        while nxt < n_requests:
            i, o = mix[nxt % len(mix)]
            if not inst.accepts(i, now, check_tbt):
                break
            nxt += 1
            ends.extend(c.end_s for c in inst.join(nxt, now, i, o, now))
        if inst.next_event_s < math.inf:
            heapq.heappush(heap, (inst.next_event_s, inst.index, inst.version))

    for inst in pool:
        fill(inst)
    while heap and len(ends) < n_requests:
        now, j, version = heapq.heappop(heap)
        inst = pool[j]
        if inst.version != version:
            continue
        ends.extend(c.end_s for c in inst.on_event(now) if not c.preempted)
        fill(inst)
    return _interquartile_rate(ends, n_requests)


def _interquartile_rate(ends: list, n_requests: int) -> float:
    """Completions per second between the first and the third quartile of the completion times
    ``ends`` (the ramp-up and the drain left out)."""
    ends.sort()
    q1, q3 = len(ends) // 4, 3 * len(ends) // 4
    if q3 - q1 < 10 or ends[q3] <= ends[q1]:
        raise ValueError(f"n_requests: {n_requests} requests are too few to measure the decode pool's rate")
    return (q3 - q1) / (ends[q3] - ends[q1])


def _reserve_decode_rate(p: ClusterPreset, mix: list, n_requests: int) -> float:
    """:func:`_batching_decode_rate` for ``p``'s ``reserve`` decode pool: whenever an instance has
    room for the next request of ``mix`` (input + output tokens) it holds it for output x ``tbt_s``;
    an instance's requests that end at one time all leave before it takes the next ones. The
    completions per second between the first and the last quarter of ``n_requests``."""
    pool = [ReservingDecodeInstance(j, p.decode_capacity_per_instance, p.tbt_s) for j in range(p.n_decode)]
    held: list[list[tuple[float, int, int]]] = [[] for _ in pool]  # per instance: (end, order, tokens)
    fills = [0] * len(pool)  # an instance's entry in the heap is valid if made by its last fill
    ends: list[float] = []
    heap: list[tuple[float, int, int]] = []
    nxt = order = 0
    now = 0.0

    def fill(j: int) -> None:
        nonlocal nxt, order
        inst, mine = pool[j], held[j]
        while nxt < n_requests:
            i, o = mix[nxt % len(mix)]
            if not inst.accepts(i + o):
                break
            nxt += 1
            order += 1
            heapq.heappush(mine, (inst.hold(i + o, o, now), order, i + o))
        fills[j] += 1
        if mine:
            heapq.heappush(heap, (mine[0][0], j, fills[j]))

    for j in range(len(pool)):
        fill(j)
    while heap and len(ends) < n_requests:
        now, j, made = heapq.heappop(heap)
        if made != fills[j]:
            continue
        mine = held[j]
        while mine and mine[0][0] <= now:
            end, _, tokens = heapq.heappop(mine)
            pool[j].release(tokens)
            ends.append(end)
        fill(j)
    return _interquartile_rate(ends, n_requests)


def decode_capacity_rate(trace: Trace, preset: str | ClusterPreset = "lecture") -> float:
    """Requests/s the ``reserve`` decode pool of ``preset`` completes on ``trace``'s requests, in
    closed form (lecture demo 3): n_decode x capacity / the mean occupancy of a request, (input +
    output) tokens held for its decode time (output x ``tbt_s``), in token-seconds: the rate if the
    pool's KV were always full. :func:`saturation` measures the pool instead (whole requests, packed
    as they come), which gives this rate where packing leaves no room idle (e.g. every request alike,
    a whole number of them filling an instance) and less otherwise (``tests/test_saturation_reserve.py``)."""
    p = get_preset(preset)
    if p.decode_model != "reserve":
        raise ValueError(f"preset: the closed form holds for the 'reserve' decode model, not {p.decode_model!r}")
    if len(trace) == 0:
        raise ValueError("trace: the base trace has no requests")
    decode_s, tbt_s = p.decode_cost.decode_s, p.tbt_s
    occ = np.mean([(i + o) * decode_s(o, tbt_s) for i, o in zip(trace.input_tokens.tolist(), trace.output_tokens.tolist())])
    if not occ > 0:
        raise ValueError("trace: the base trace's requests occupy no decode capacity (all outputs are 0)")
    return p.n_decode * p.decode_capacity_per_instance / float(occ)


def overload_workload(base: Trace | None = None, load: float = DEMO3_LOAD, n_requests: int = DEMO3_REQUESTS,
                      seed: int = 0, preset: str | ClusterPreset = "lecture", fresh_blocks: bool = False,
                      pool: str | None = None) -> tuple[Trace, Saturation]:
    """``n_requests`` drawn i.i.d. from ``base`` with Poisson arrivals at ``load`` x a rate of the
    cluster; returns (trace, saturation). ``pool="cluster"``: x the cluster's measured saturation
    throughput (:func:`saturation`, the smaller of the two pools' rates). ``pool="decode"``: x the
    decode pool's alone, lecture demo 3's definition of load; under the ``reserve`` decode model
    that rate is demo 3's closed form :func:`decode_capacity_rate`, and the saturation returned
    carries it as its ``decode_per_s`` (its ``cluster_per_s`` and ``bottleneck`` follow from it).
    ``pool=None`` (the default): ``"decode"`` under the ``reserve`` model (the lecture's), else
    ``"cluster"``. The defaults are demo 3's workload: 6,000 requests from the synthetic trace of
    seed ``seed`` at 4 sessions/s, at twice the ``lecture`` decode pool's closed-form capacity rate.

    ``fresh_blocks=True`` (opt-in) gives each re-drawn copy of a request fresh ids for the blocks it
    brought into ``base``, those no earlier request of ``base`` holds (``workload.redrawn_block_ids``):
    without it a long draw repeats prompts whose blocks are already cached, and its prefix-hit
    ratio climbs with its length."""
    check("load", load)  # a multiple of the saturation throughput
    check("requests", n_requests)
    if base is None:
        base = synthetic_trace(seed, rate=DEMO3_BASE_RATE)
    sat, rate = load_reference(base, preset, pool)
    return resample_iid(base, n_requests, load * rate, seed, fresh_blocks=fresh_blocks), sat


def load_reference(base: Trace, preset: str | ClusterPreset = "lecture", pool: str | None = None
                   ) -> tuple[Saturation, float]:
    """``(saturation, rate)``: the saturation of ``preset``'s pools on ``base``'s request mix and the
    arrival rate (requests/s) that is load 1 by ``pool``'s definition (:func:`overload_workload`):
    ``"cluster"``, the smaller of the two pools' rates; ``"decode"``, the decode pool's (under the
    ``reserve`` model demo 3's closed form :func:`decode_capacity_rate`, carried as the saturation's
    ``decode_per_s``); None, ``"decode"`` under ``reserve`` and ``"cluster"`` under batching."""
    if pool not in (None, "cluster", "decode"):
        raise ValueError(f"pool: expected 'cluster', 'decode' or None, got {pool!r}")
    p = get_preset(preset)
    reserve = p.decode_model == "reserve"
    if pool is None:
        pool = "decode" if reserve else "cluster"
    sat = saturation(base, p)
    if pool == "decode" and reserve:  # demo 3's definition: the reserve model's closed form
        closed = decode_capacity_rate(base, p)
        sat = Saturation(sat.prefill_per_s, closed, min(sat.prefill_per_s, closed),
                         "prefill" if sat.prefill_per_s < closed else "decode")
    return sat, (sat.cluster_per_s if pool == "cluster" else sat.decode_per_s)
