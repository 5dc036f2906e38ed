"""The admission problem of the lecture: a prefill pool and a decode pool under overload (Mooncake v3 §7).

Not a simulator of its own: :class:`LectureAdmission` runs the one cluster simulator
(:class:`mooncake_gym.sim.cluster.ClusterSimulator`) under the ``lecture`` preset and pauses at every
arrival for one decision, admit or reject; :func:`simulate` is a loop over it and the Gym environment
``mooncake_gym/OverloadAdmission-v0`` is a thin adapter over the same object, so a policy gives
identical numbers whichever way it is run. What it adds to the cluster is the lecture's view
(:class:`~mooncake_gym.sim.views.AdmissionView`) and its metrics (:class:`OverloadResult`).

The cluster under the lecture's settings
----------------------------------------
- **Prefill pool**: ``n_prefill`` FIFO instances. An admitted request goes to the instance with the
  least queued work (ties: the lowest index; :class:`~mooncake_gym.sim.policies.LeastQueue`) and
  takes ``CostModel.prefill_s(input_tokens, 0)`` seconds there. Prefix caching is *not* modelled
  (``cache_blocks=0``): the admission problem is about the two pools' loads, and leaving the cache
  out keeps the prefill times a function of the request alone.
- **Decode pool**: the ``reserve`` decode model, ``n_decode`` instances holding
  ``decode_capacity_tokens`` tokens of KV each. When a request's prefill finishes it needs one
  decode instance with room for ``input + output`` tokens. It goes to the instance with the most
  free room, which it occupies for ``output x tbt_s`` seconds and frees at exactly its decode end.
  If no instance has room the request is *rejected after prefill* and its prefill time is wasted
  (the paper's baseline, where the decode side checks its SLO only after prefill). No KV transfer,
  and nothing is refused at arrival without asking the policy.
- **TTFT** is the prefill finish minus the arrival (queue + prefill). Queues are FIFO and prefill
  times deterministic, so the TTFT predicted at arrival is exactly the TTFT the request gets.

Load series
-----------
The lecture's definition (the cluster's ``load_series="lecture"``): every ``sample_period_s`` seconds
from 0 up to the last arrival (the drain after the last arrival is left out, as it would add a
common downward trend), the prefill load (share of prefill instances busy) and the decode load
(used / total decode tokens), each the state after all events at or before the sample time; then the
Pearson correlation of the two over the samples from ``warmup_s`` on (Mooncake v3 Figure 9). It is NaN
when a series is constant in that window, e.g. when prefill never idles, as under the baseline policy
at twice the decode capacity.

Finite workloads
----------------
After the last arrival the prefills still queued are run and decoded (the drain). A policy that
keeps a long prefill queue (baseline keeps about one TTFT SLO of work) completes those requests
then, which counts in ``completed``; ``steady_completed_per_s`` (decode starts per second between
``warmup_s`` and the last arrival) compares policies without that end effect.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Callable

import numpy as np

from mooncake_gym._moved import renamed
from mooncake_gym.model.limits import MAX_LOAD_SAMPLES, check, check_bound
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.policy import policy_name, reset_policy
from mooncake_gym.model.presets import PRESETS, ClusterPreset
from mooncake_gym.model.workload import Trace
# demo 3's workload and the closed-form capacity rate, re-exported for the lecture's users
from mooncake_gym.sim.cluster import (DEMO3_BASE_RATE, DEMO3_LOAD, DEMO3_REQUESTS, ClusterSimulator,  # noqa: F401
                                      decode_capacity_rate, overload_workload)
from mooncake_gym.sim.metrics import (COMPLETED, OUTCOME_NAMES, PENDING, REJECTED_AFTER_PREFILL,  # noqa: F401
                                      REJECTED_AT_ARRIVAL, load_correlation)
from mooncake_gym.sim.policies import LeastQueue
from mooncake_gym.sim.views import ADMISSION_VIEW_FIELDS, AdmissionView, Route, check_admit


@dataclass(frozen=True)
class OverloadConfig:
    """Parameters of the lecture's admission problem (defaults: lecture demo 3 / Mooncake v3 §7-8).

    - ``n_prefill``, ``n_decode``: instances in each pool (8 + 8 as in the paper's Table 3).
    - ``decode_capacity_tokens``: KV tokens one decode instance holds (lecture: 60,000).
    - ``tbt_s``: time between tokens of decode, seconds per output token (lecture: 0.05).
    - ``ttft_slo_s``: the TTFT SLO, seconds (paper v3 §8.1.3: 30 s); goodput counts requests that
      complete with TTFT <= it, and the view carries it for the policies' prefill check.
    - ``sample_period_s``: period of the load series, seconds (lecture: 5).
    - ``oracle``: show the policy each request's output length (real systems do not know it).
    - ``recent_window_s``: the window, seconds, of the view's recent rejection and waste counts.
    - ``warmup_s``: load samples before this time are left out of the load correlation, and
      completions before it out of the steady-state completion rate: starting from an empty
      cluster both loads rise together, which says nothing about the steady state.
    """

    n_prefill: int = 8
    n_decode: int = 8
    decode_capacity_tokens: int = 60_000
    tbt_s: float = 0.05
    ttft_slo_s: float = 30.0
    sample_period_s: float = 5.0
    oracle: bool = False
    recent_window_s: float = 30.0
    warmup_s: float = 30.0

    def __post_init__(self):
        for name in ("n_prefill", "n_decode", "decode_capacity_tokens", "tbt_s", "ttft_slo_s", "sample_period_s",
                     "recent_window_s", "warmup_s"):
            check(name, getattr(self, name))  # the ranges of mooncake_gym.model.limits
        if not isinstance(self.oracle, bool):
            raise ValueError(f"oracle: expected True or False, got {self.oracle!r}")

    @property
    def decode_pool_capacity_tokens(self) -> int:
        """KV tokens of the whole decode pool."""
        return self.n_decode * self.decode_capacity_tokens

    pool_capacity_tokens = renamed("pool_capacity_tokens", "decode_pool_capacity_tokens")

    def preset(self, cost: CostModel | None = None) -> ClusterPreset:
        """This admission problem as a cluster: the ``lecture`` preset with these pools, SLO and
        ``tbt_s``, no prefix cache, every instance ``cost``'s (default ``CostModel()``)."""
        cm = cost if cost is not None else CostModel()
        return PRESETS["lecture"].with_(prefill_cost=cm, decode_cost=cm, n_prefill=self.n_prefill,
                                        n_decode=self.n_decode, cache_blocks=0, ttft_slo_s=self.ttft_slo_s,
                                        decode_capacity_tokens=self.decode_capacity_tokens, tbt_s=self.tbt_s)


@dataclass
class OverloadResult:
    """Metrics, per-request outcomes and load series of one run."""

    policy: str
    config: OverloadConfig
    metrics: dict
    outcome: np.ndarray  # int8, one of COMPLETED, REJECTED_AT_ARRIVAL, REJECTED_AFTER_PREFILL (PENDING if unfinished)
    ttft_s: np.ndarray  # prefill finish - arrival; NaN if rejected at arrival
    prefill_s: np.ndarray  # prefill service time of every request (whether admitted or not)
    prefill_instance: np.ndarray  # -1 if rejected at arrival
    decode_instance: np.ndarray  # -1 unless completed
    decode_start_s: np.ndarray  # NaN unless completed
    decode_end_s: np.ndarray  # NaN unless completed
    sample_times_s: np.ndarray
    prefill_load: np.ndarray  # share of prefill instances busy at each sample time
    decode_load: np.ndarray  # decode pool occupancy at each sample time
    correlation: float

    def series(self, until_s: float | None = None) -> list[dict]:
        """The load series as rows (time_s, prefill_load, decode_load), up to ``until_s``."""
        rows = []
        for t, p, d in zip(self.sample_times_s.tolist(), self.prefill_load.tolist(), self.decode_load.tolist()):
            if until_s is not None and t > until_s:
                break
            rows.append({"time_s": t, "prefill_load": p, "decode_load": d})
        return rows


_new_tuple = tuple.__new__
_used = attrgetter("used")  # a reserving decode instance's used tokens


def check_load_samples(name: str, span_s: float, config: OverloadConfig) -> None:
    """Refuse (``ValueError`` naming ``name``) a workload spanning ``span_s`` seconds whose load series
    would hold more than ``MAX_LOAD_SAMPLES`` samples of ``config.sample_period_s``."""
    check_bound(name, span_s / config.sample_period_s + 1, MAX_LOAD_SAMPLES,
                f"load-series samples (a span of {span_s:.3g} s / sample_period_s {config.sample_period_s:g})",
                "raise sample_period_s, or use a shorter workload (a higher rate or load, fewer requests)")


def _cluster_counter(name: str, empty):
    """A read-only attribute of :class:`LectureAdmission`: its cluster's ``name`` (``empty`` for an
    empty trace, which has no cluster)."""
    return property(lambda self: empty if self.cluster is None else getattr(self.cluster, name),
                    doc=f"The cluster's ``{name}``.")


class LectureAdmission:
    """The lecture's admission problem on the one cluster: pauses at each arrival for admit / reject.

    ::

        sim = LectureAdmission(trace)
        view = sim.reset()
        while view is not None:
            view = sim.step(view.predicted_ttft_s <= view.ttft_slo_s)
        sim.result().metrics["completed"]

    Not a simulator of its own: ``self.cluster`` is a
    :class:`~mooncake_gym.sim.cluster.ClusterSimulator` of ``config.preset(cost)`` (the ``lecture``
    preset: reserve-up-front decode at ``tbt_s`` per token, no prefix cache) with the lecture's
    least-queue prefill rule, no KV transfer, nothing refused at arrival and the lecture's load
    series. This class adds what the lecture's policies see (:class:`AdmissionView`: the recent
    rejection window and the workload's decode-time statistics) and its metrics
    (:class:`OverloadResult`).

    Counters an environment can diff between steps: ``completed_in_slo`` (admitted requests that
    got a decode slot with TTFT <= SLO), ``completed`` (got a decode slot: under the reserve model
    it then completes for sure), ``rejected_at_arrival``, ``rejected_after_prefill`` and
    ``wasted_prefill_s``. They change when the simulator advances to the next arrival.

    ``engine``: the cluster's (``ClusterSimulator(engine=)``); ``"python"`` by default, since this
    class's view reads the cluster's state at every decision, which the native cluster copies out
    of the engine (``"native"`` gives the same numbers: tests/test_engine_cluster.py).
    """

    def __init__(self, trace: Trace, config: OverloadConfig | None = None, cost: CostModel | None = None,
                 engine: str | None = "python"):
        if not isinstance(trace, Trace):
            raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
        if config is None:
            config = OverloadConfig()
        if not isinstance(config, OverloadConfig):
            raise ValueError(f"config: expected an OverloadConfig, got {type(config).__name__}")
        self.trace = trace
        self.config = c = config
        self.cost = cost if cost is not None else CostModel()
        self._arrival = trace.arrival_s.tolist()
        self._input = trace.input_tokens.tolist()
        self._output = trace.output_tokens.tolist()
        n = len(trace)
        # The workload's decode-time statistics (what a deployment knows from its logs).
        self.mean_output_tokens = float(np.mean(self._output)) if n else 0.0
        self.mean_decode_s = self.cost.decode_s(self.mean_output_tokens, c.tbt_s)
        self._horizon = float(trace.arrival_s[-1]) if n else 0.0
        # the load series has one sample per sample_period_s up to the last arrival: bound it
        # before the run (the decode-time tables above are bounded by the output-length limit)
        check_load_samples("trace", self._horizon, c)
        self.cluster: ClusterSimulator | None = None
        self._decode_pool_capacity_tokens = c.decode_pool_capacity_tokens
        # each request's prefill time on any instance of the pool (all alike, none caching): the
        # prefill_s its views show, by the pool's own estimate, made when first needed (_prefill_times)
        self._prefill_s: list[float] | None = None if n else []
        if n:
            self.cluster = ClusterSimulator(trace, c.preset(self.cost), router=LeastQueue(), refuse_never_fit=False,
                                            kv_transfer=False, oracle=c.oracle, sample_period_s=c.sample_period_s,
                                            warmup_s=c.warmup_s, load_series="lecture", engine=engine)
        self._fresh = True  # the cluster as its constructor left it: reset() need not reset it again
        self._started = False
        self._reset_window()

    def _reset_window(self) -> None:
        self._recent_rejections: deque = deque()  # times
        self._recent_waste: deque = deque()  # (time, seconds)
        self._recent_waste_sum = 0.0
        self._seen_waste = 0  # entries of the cluster's wasted_log moved into the window
        self._pending: AdmissionView | None = None

    # -- the cluster's state under the lecture's names ---------------------------------------------
    @property
    def done(self) -> bool:
        return self.cluster is None or self.cluster.done

    @property
    def now(self) -> float:
        return self._horizon if self.cluster is None else self.cluster.now

    completed = _cluster_counter("granted", 0)
    completed_in_slo = _cluster_counter("granted_in_ttft_slo", 0)
    rejected_at_arrival = _cluster_counter("rejected_at_arrival", 0)
    rejected_after_prefill = _cluster_counter("rejected_after_prefill", 0)
    wasted_prefill_s = _cluster_counter("wasted_prefill_s", 0.0)
    admitted = _cluster_counter("admitted", 0)
    outcome = _cluster_counter("outcome", [])

    @property
    def decode_used_per_instance(self) -> list[int]:
        return [] if self.cluster is None else [d.used for d in self.cluster.decode]

    def _prefill_times(self) -> list[float]:
        """Each request's prefill time on any instance of the pool (made on first use)."""
        if self._prefill_s is None:
            assert self.cluster is not None  # (an empty trace has its empty list)
            self._prefill_s = self.cluster.prefill.uncached_prefill_s(0)
        return self._prefill_s

    # -- stepping -----------------------------------------------------------------------------------
    def reset(self) -> AdmissionView | None:
        """Start over; the view of the first arrival (None for an empty trace)."""
        self._started = True
        self._reset_window()
        if self.cluster is None:
            return None
        if not self._fresh:
            self.cluster.reset()  # (the prefill times stay: the trace's and the cost model's)
        self._fresh = False
        return self._view()

    def step(self, admit: bool) -> AdmissionView | None:
        """Admit (True) or reject (False) the current request; the view of the next arrival, or
        None once the workload is exhausted (all remaining events then drained). ``admit`` is
        checked by :func:`check_admit` (1 and 0 are accepted; ``'no'``, -1 or NaN are errors)."""
        if not self._started:
            raise RuntimeError("step() before reset()")
        sim = self.cluster
        if sim is None or sim._done:
            raise RuntimeError("step() after the workload is exhausted; call reset()")
        if admit is not True and admit is not False:
            admit = check_admit(admit)
        v = self._pending
        assert v is not None
        if admit:  # to the least-queued instance the view shows (a valid Route: made without its checks)
            sim.apply(True, _new_tuple(Route, (v.prefill_instance, False)), None)
        else:
            self._recent_rejections.append(v.now)
            sim.apply(False, None, None)
        return None if sim._done else self._view()

    def _view(self) -> AdmissionView:
        # The hot path of every decision: read from the cluster's state directly, without its
        # ClusterView or the prefill pool's RoutingView (made only if a policy reads them).
        sim = self.cluster
        assert sim is not None
        i = sim._i  # the pending request
        now = self._arrival[i]
        # each prefill instance's queued work (the exact view's queue_s: the cluster's prefill pool
        # has the exact observation) and the least queued one (ties: the lowest index)
        queue = []
        best, best_q = 0, math.inf
        for k, inst in enumerate(sim.prefill.instances):
            q = inst.busy_until - now
            if q < 0.0:
                q = 0.0
            queue.append(q)
            if q < best_q:
                best, best_q = k, q
        queues = tuple(queue)
        # its prefill there (the view's prefill_s: no cache, every instance alike)
        ps = (self._prefill_s or self._prefill_times())[i]
        finish = now + best_q + ps
        # the recent window: the cluster's rejections after prefill since the last view (after this
        # layer's rejection at arrival of the last request, if any: in time order), then the old ones out
        rej, waste = self._recent_rejections, self._recent_waste
        log = sim.wasted_log
        if self._seen_waste < len(log):
            for k in range(self._seen_waste, len(log)):
                t, w = log[k]
                rej.append(t)
                waste.append((t, w))
                self._recent_waste_sum += w
            self._seen_waste = len(log)
        c = self.config
        cutoff = now - c.recent_window_s
        while rej and rej[0] < cutoff:
            rej.popleft()
        while waste and waste[0][0] < cutoff:
            self._recent_waste_sum -= waste.popleft()[1]
        if not waste:
            self._recent_waste_sum = 0.0
        used = tuple(map(_used, sim.decode))
        v = self._pending = _new_tuple(AdmissionView, (
            now, i, self._input[i], self._output[i] if c.oracle else None,
            sum(used), self._decode_pool_capacity_tokens, used, c.decode_capacity_tokens,
            queues, best, ps, finish, finish - now, c.ttft_slo_s,
            len(rej), len(waste), self._recent_waste_sum,
            sim.requests_in_prefill, sim.requests_in_decode,
            self.mean_decode_s, self.mean_output_tokens, sim,
        ))
        return v

    # -- results ----------------------------------------------------------------------------------
    def _mean_occupancy(self, starts: np.ndarray, ends: np.ndarray, tokens: np.ndarray) -> float:
        """The decode pool's occupancy averaged over time on [0, horizon] (before the run is done,
        over [0, the last change]): the used tokens integrated between the times they change."""
        h = self._horizon
        if not h > 0:
            return float("nan")
        # the net change of the used tokens at each distinct time (exact: integer sums)
        times, at = np.unique(np.concatenate((starts, ends)), return_inverse=True)
        net = np.zeros(len(times), dtype=np.int64)
        np.add.at(net, at, np.concatenate((tokens, -tokens)).astype(np.int64))
        if self.done:  # every change before the horizon, then the horizon
            keep = times < h
            times, net = np.append(times[keep], h), np.append(net[keep], 0)
        else:  # the changes so far (at or before the pending arrival)
            keep = times <= self.now
            times, net = times[keep], net[keep]
        if len(times):
            # the level held since the previous change times the time it is held, summed in time
            # order (accumulate adds term by term, as a loop would; the first term is 0)
            level = np.concatenate(([0], np.cumsum(net)[:-1]))
            held = times - np.concatenate(([0.0], times[:-1]))
            area = float(np.add.accumulate(level * held)[-1])
            t0 = float(times[-1]) if times[-1] > 0.0 else 0.0
        else:
            area, t0 = 0.0, 0.0
        span = h if self.done else max(t0, 1e-300)
        return area / span / self.config.decode_pool_capacity_tokens

    def result(self, policy: str = "policy") -> OverloadResult:
        """Metrics, outcomes and load series (complete once ``done``)."""
        c = self.config
        sim = self.cluster
        n = len(self._input)
        horizon = self._horizon
        output = np.asarray(self._output, dtype=np.int64)
        if sim is None:
            nan = np.full(0, np.nan)
            outcome, ttft, starts, instance = np.zeros(0, np.int8), nan, nan, np.zeros(0, np.int64)
            decode_instance, times, prefill_load, decode_load = instance, nan, nan, nan
        else:
            outcome = np.array(sim.outcome, dtype=np.int8)  # (a copy: changed below)
            ttft = np.asarray(sim.ttft_s, dtype=np.float64)
            starts = np.asarray(sim.decode_start_s, dtype=np.float64)
            instance = np.asarray(sim.prefill_instance, dtype=np.int64)
            decode_instance = np.asarray(sim.decode_instance, dtype=np.int64)
            times = np.asarray(sim._samples_t, dtype=np.float64)
            prefill_load = np.asarray(sim._samples_p, dtype=np.float64)
            decode_load = np.asarray(sim._samples_d, dtype=np.float64)
        started = ~np.isnan(starts)
        outcome[started] = COMPLETED  # a request that got its decode slot completes for sure
        ends = np.where(started, starts + output * c.tbt_s, np.nan)
        completed_ttft = ttft[outcome == COMPLETED]
        steady = times >= c.warmup_s
        corr = load_correlation(prefill_load[steady], decode_load[steady])
        span = horizon - c.warmup_s
        steady_rate = (float(np.count_nonzero((starts >= c.warmup_s) & (starts <= horizon))) / span
                       if span > 0 else float("nan"))
        need = np.asarray(self._input, dtype=np.int64) + output
        mean_occ = self._mean_occupancy(starts[started], ends[started], need[started])
        rejected = self.rejected_at_arrival + self.rejected_after_prefill
        metrics = {
            "policy": policy,
            "requests": n,
            "completed": self.completed,
            "goodput": self.completed_in_slo,
            "rejected": rejected,
            "rejected_at_arrival": self.rejected_at_arrival,
            "rejected_after_prefill": self.rejected_after_prefill,
            "admitted": self.admitted,
            "wasted_prefill_s": self.wasted_prefill_s,
            "wasted_share_of_admitted": self.rejected_after_prefill / self.admitted if self.admitted else 0.0,
            "mean_decode_occupancy": mean_occ,
            "mean_prefill_load": float(prefill_load.mean()) if len(prefill_load) else float("nan"),
            "load_correlation": corr,
            "mean_ttft_s": float(completed_ttft.mean()) if len(completed_ttft) else float("nan"),
            "p90_ttft_s": float(np.percentile(completed_ttft, 90)) if len(completed_ttft) else float("nan"),
            "duration_s": horizon,
            "goodput_per_s": self.completed_in_slo / horizon if horizon > 0 else float("nan"),
            "steady_completed_per_s": steady_rate,
            "completed_after_last_arrival": int(np.count_nonzero(starts > horizon)),
        }
        return OverloadResult(
            policy=policy,
            config=c,
            metrics=metrics,
            outcome=outcome,
            ttft_s=ttft,
            prefill_s=np.asarray(self._prefill_times(), dtype=np.float64),
            prefill_instance=instance,
            decode_instance=decode_instance,
            decode_start_s=starts,
            decode_end_s=ends,
            sample_times_s=times,
            prefill_load=prefill_load,
            decode_load=decode_load,
            correlation=corr,
        )


#: The old name (0.1): the lecture's admission problem is this view of the one cluster now.
OverloadSimulator = LectureAdmission


def simulate(trace: Trace, policy: Callable, config: OverloadConfig | None = None, cost: CostModel | None = None,
             seed: int = 0) -> OverloadResult:
    """Run ``policy`` (``view -> bool``, admit) over ``trace``; ``policy.reset(rng)`` is called first."""
    if not callable(policy):
        raise ValueError(f"policy: expected a callable view -> bool, got {type(policy).__name__}")
    sim = LectureAdmission(trace, config, cost)
    reset_policy(policy, seed)
    view = sim.reset()
    step = sim.step
    while view is not None:
        view = step(policy(view))  # step checks the answer (check_admit)
    return sim.result(policy_name(policy))
