"""The admission problem: a prefill pool and a decode pool under overload (Mooncake v3 §7).

One step-able simulator, :class:`OverloadSimulator`, pauses at every arrival and asks for one
decision, admit or reject; :func:`simulate` is a loop over it and the Gym environment is a thin
adapter over the same object, so a policy gives identical numbers whichever way it is run.

The system
----------
- **Prefill pool**: ``n_prefill`` FIFO instances (:class:`~mooncake_gym.sim.prefill.PrefillInstance`,
  the routing simulator's). An admitted request goes to the instance with the least queued work
  (ties: the lowest index) and takes ``CostModel.prefill_s(input_tokens, 0)`` seconds there.
  Prefix caching is *not* modelled here (every prompt is computed in full; the instances are built
  with ``cached=False``): the admission problem is about the two pools' loads, and leaving the
  cache out keeps the prefill times a function of the request alone.
- **Decode pool**: ``n_decode`` instances holding ``decode_capacity_tokens`` tokens of KV each.
  When a request's prefill finishes it needs one decode instance with room for
  ``input + output`` tokens. It goes to the instance with the most free room, which it occupies for
  ``CostModel.decode_s(output, tbt_s)`` seconds and frees at exactly its decode end. If no instance
  has room the request is *rejected after prefill* and its prefill time is wasted (the paper's
  baseline, where the decode side checks its SLO only after prefill).
- **TTFT** is the prefill finish minus the arrival (queue + prefill; the KV transfer to decode is
  not modelled). Queues are FIFO and prefill times deterministic, so the TTFT predicted at arrival
  is exactly the TTFT the request gets.

Events and determinism
----------------------
Arrivals come from the trace in order; prefill and decode completions sit in one heap ordered by
(time, kind, sequence number) with decode completions before prefill completions at equal times,
so a decode slot freed at time t is available to a prefill finishing at t. The decision at an
arrival at time t sees the state after every completion at or before t. No randomness is used.

Load series
-----------
Every ``sample_period_s`` seconds from 0 up to the last arrival (the drain after the last arrival
is left out, as it would add a common downward trend): the prefill load (share of prefill
instances busy) and the decode load (used / total decode tokens), each the state after all events
at or before the sample time; then the Pearson correlation of the two over the samples from
``warmup_s`` on (Mooncake v3 Figure 9). It is NaN when a series is constant in that window, e.g.
when prefill never idles, as under the baseline policy at twice the decode capacity.

Finite workloads
----------------
After the last arrival the prefills still queued are run and decoded (the drain). A policy that
keeps a long prefill queue (baseline keeps about one TTFT SLO of work) completes those requests
then, which counts in ``completed``; ``steady_completed_per_s`` (decode starts per second between
``warmup_s`` and the last arrival) compares policies without that end effect.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from mooncake_gym.sim.prefill import PrefillInstance
from mooncake_gym.model.limits import MAX_LOAD_SAMPLES, check, check_bound
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.policy import policy_name, reset_policy
from mooncake_gym.model.presets import PRESETS, ClusterPreset
from mooncake_gym.model.workload import Trace
# demo 3's workload and the closed-form capacity rate, re-exported for the lecture's users
from mooncake_gym.sim.cluster import (DEMO3_BASE_RATE, DEMO3_LOAD, DEMO3_REQUESTS, decode_capacity_rate,  # noqa: F401
                                      overload_workload)
from mooncake_gym.sim.metrics import (COMPLETED, OUTCOME_NAMES, PENDING, REJECTED_AFTER_PREFILL, REJECTED_AT_ARRIVAL,
                                      load_correlation, quantile_table)
from mooncake_gym.sim.views import ADMISSION_VIEW_FIELDS, AdmissionView, check_admit

# Heap event kinds: at equal times decode completions are handled before prefill completions.
_DECODE_DONE = 0
_PREFILL_DONE = 1


def _check(name: str, ok: bool, expected: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")


@dataclass(frozen=True)
class OverloadConfig:
    """Parameters of the overload simulator (defaults: lecture demo 3 / Mooncake v3 §7-8).

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
        _check("oracle", isinstance(self.oracle, bool), "True or False", self.oracle)

    @property
    def pool_capacity_tokens(self) -> int:
        return self.n_decode * self.decode_capacity_tokens

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


def check_load_samples(name: str, span_s: float, config: OverloadConfig) -> None:
    """Refuse (``ValueError`` naming ``name``) a workload spanning ``span_s`` seconds whose load series
    would hold more than ``MAX_LOAD_SAMPLES`` samples of ``config.sample_period_s``."""
    check_bound(name, span_s / config.sample_period_s + 1, MAX_LOAD_SAMPLES,
                f"load-series samples (a span of {span_s:.3g} s / sample_period_s {config.sample_period_s:g})",
                "raise sample_period_s, or use a shorter workload (a higher rate or load, fewer requests)")


class OverloadSimulator:
    """Prefill + decode pools under overload; pauses at each arrival for an admit/reject decision.

    ::

        sim = OverloadSimulator(trace)
        view = sim.reset()
        while view is not None:
            view = sim.step(view.predicted_ttft_s <= view.ttft_slo_s)
        sim.result().metrics["completed"]

    Counters an environment can diff between steps: ``completed_in_slo`` (admitted requests that
    got a decode slot with TTFT <= SLO), ``completed``, ``rejected_at_arrival``,
    ``rejected_after_prefill`` and ``wasted_prefill_s``. They change when the simulator advances to
    the next arrival (completions happen between arrivals).
    """

    def __init__(self, trace: Trace, config: OverloadConfig | None = None, cost: CostModel | None = None):
        if not isinstance(trace, Trace):
            raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
        if config is None:
            config = OverloadConfig()
        if not isinstance(config, OverloadConfig):
            raise ValueError(f"config: expected an OverloadConfig, got {type(config).__name__}")
        self.trace = trace
        self.config = config
        self.cost = cost if cost is not None else CostModel()
        c = config
        self._arrival = trace.arrival_s.tolist()
        self._input = trace.input_tokens.tolist()
        self._output = trace.output_tokens.tolist()
        prefill_s, decode_s = self.cost.prefill_s, self.cost.decode_s
        memo: dict[int, float] = {}  # i.i.d. resampled traces repeat prompt lengths
        self._prefill_s = [memo[n] if n in memo else memo.setdefault(n, prefill_s(n, 0)) for n in self._input]
        self._decode_s = [decode_s(o, c.tbt_s) for o in self._output]
        self._need = [i + o for i, o in zip(self._input, self._output)]
        # The workload's decode-time statistics (what a deployment knows from its logs).
        n = len(trace)
        self.mean_output_tokens = float(np.mean(self._output)) if n else 0.0
        self.mean_decode_s = decode_s(self.mean_output_tokens, c.tbt_s)
        if n:
            counts = np.bincount(np.asarray(self._output, dtype=np.int64))
            # _survival[k] = P(output > k) for k = 0..max_output
            self._survival = (1.0 - np.cumsum(counts) / n).tolist()
        else:
            self._survival = [0.0]
        self._quantile_tables: dict[float, list[int]] = {}
        self._horizon = self._arrival[-1] if n else 0.0
        # the load series has one sample per sample_period_s up to the last arrival: bound it
        # before the run (the decode-time tables above are bounded by the output-length limit)
        check_load_samples("trace", self._horizon, c)
        self._reset_state()

    # -- state ----------------------------------------------------------------------------------
    def _reset_state(self) -> None:
        c = self.config
        n = len(self._arrival)
        self._prefill = [PrefillInstance(i, cached=False) for i in range(c.n_prefill)]
        self._prefill_fifo = [deque() for _ in range(c.n_prefill)]  # (finish, request) per instance
        self._decode_used = [0] * c.n_decode
        self._used_total = 0
        self._in_decode: dict[int, tuple[float, int]] = {}  # request -> (decode start, tokens)
        self._heap: list = []
        self._seq = 0
        self._i = 0  # the request awaiting a decision
        self._done = n == 0
        self._started = False
        self._pending_instance = 0
        self.outcome = [PENDING] * n
        self.ttft_s = [math.nan] * n
        self.prefill_instance = [-1] * n
        self.decode_instance = [-1] * n
        self.decode_start_s = [math.nan] * n
        self.decode_end_s = [math.nan] * n
        # cumulative counters
        self.completed = 0
        self.completed_in_slo = 0
        self.rejected_at_arrival = 0
        self.rejected_after_prefill = 0
        self.wasted_prefill_s = 0.0
        self.admitted = 0
        # recent window
        self._recent_rejections: deque = deque()  # times
        self._recent_waste: deque = deque()  # (time, seconds)
        self._recent_waste_sum = 0.0
        # load series and time-weighted decode occupancy over [0, horizon]
        self._samples_t: list[float] = []
        self._samples_p: list[float] = []
        self._samples_d: list[float] = []
        self._k_sample = 0
        self._next_sample = 0.0
        self._occ_area = 0.0
        self._occ_last_t = 0.0

    @property
    def done(self) -> bool:
        return self._done

    @property
    def now(self) -> float:
        return self._arrival[self._i] if self._i < len(self._arrival) else self._horizon

    def reset(self) -> AdmissionView | None:
        """Start over; the view of the first arrival (None for an empty trace)."""
        self._reset_state()
        self._started = True
        if self._done:
            return None
        return self._advance_to_arrival()

    def step(self, admit: bool) -> AdmissionView | None:
        """Admit (True) or reject (False) the current request; the view of the next arrival, or
        None once the workload is exhausted (all remaining events then drained). ``admit`` is
        checked by :func:`check_admit` (1 and 0 are accepted; ``'no'``, -1 or NaN are errors)."""
        if not self._started:
            raise RuntimeError("step() before reset()")
        if self._done:
            raise RuntimeError("step() after the workload is exhausted; call reset()")
        if admit is not True and admit is not False:
            admit = check_admit(admit)
        i = self._i
        now = self._arrival[i]
        if admit:
            k = self._pending_instance
            _, finish = self._prefill[k].dispatch(now, self._prefill_s[i])
            self._prefill_fifo[k].append((finish, i))
            self.prefill_instance[i] = k
            self.ttft_s[i] = finish - now
            self.admitted += 1
            self._seq += 1
            heapq.heappush(self._heap, (finish, _PREFILL_DONE, self._seq, i))
        else:
            self.outcome[i] = REJECTED_AT_ARRIVAL
            self.rejected_at_arrival += 1
            self._recent_rejections.append(now)
        self._i = i + 1
        if self._i < len(self._arrival):
            return self._advance_to_arrival()
        # the last decision: finish the load series and the occupancy integral at the horizon, then drain
        self._sample_until(math.inf)
        self._occupancy_changes(self._horizon)
        heap = self._heap
        while heap:
            t, kind, _, r = heapq.heappop(heap)
            if kind == _DECODE_DONE:
                self._decode_done(t, r)
            else:
                self._prefill_done(t, r)
        self._done = True
        return None

    # -- event handling ---------------------------------------------------------------------------
    def _sample_until(self, t: float) -> None:
        """Record the samples at times s < t (and s <= horizon): the state after events <= s."""
        s = self._next_sample
        horizon = self._horizon
        if s >= t or s > horizon:
            return
        period = self.config.sample_period_s
        n_p = len(self._prefill)
        occ = self._used_total / self.config.pool_capacity_tokens
        while s < t and s <= horizon:
            busy = 0
            for p in self._prefill:
                if p.busy_until > s:
                    busy += 1
            self._samples_t.append(s)
            self._samples_p.append(busy / n_p)
            self._samples_d.append(occ)
            self._k_sample += 1
            s = self._k_sample * period
        self._next_sample = s if s <= horizon else math.inf  # past the horizon: no more samples, no more calls

    def _occupancy_changes(self, t: float) -> None:
        """Accumulate the used-tokens area up to ``t`` (clipped to the horizon) before a change."""
        h = self._horizon
        t1 = t if t < h else h
        t0 = self._occ_last_t
        if t1 > t0:
            self._occ_area += self._used_total * (t1 - t0)
            self._occ_last_t = t1

    def _advance_to_arrival(self) -> AdmissionView:
        i = self._i
        now = self._arrival[i]
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, kind, _, r = heapq.heappop(heap)
            if self._next_sample < t:
                self._sample_until(t)
            if kind == _DECODE_DONE:
                self._decode_done(t, r)
            else:
                self._prefill_done(t, r)
        if self._next_sample < now:
            self._sample_until(now)
        return self._view(i, now)

    def _prefill_done(self, t: float, r: int) -> None:
        k = self.prefill_instance[r]
        self._prefill_fifo[k].popleft()
        need = self._need[r]
        used = self._decode_used
        best, best_used = 0, used[0]
        for j in range(1, len(used)):
            if used[j] < best_used:
                best, best_used = j, used[j]
        if best_used + need <= self.config.decode_capacity_tokens:
            self._occupancy_changes(t)
            used[best] = best_used + need
            self._used_total += need
            self._in_decode[r] = (t, need)
            end = t + self._decode_s[r]
            self.outcome[r] = COMPLETED
            self.decode_instance[r] = best
            self.decode_start_s[r] = t
            self.decode_end_s[r] = end
            self.completed += 1
            if self.ttft_s[r] <= self.config.ttft_slo_s:
                self.completed_in_slo += 1
            self._seq += 1
            heapq.heappush(self._heap, (end, _DECODE_DONE, self._seq, r))
        else:
            self.outcome[r] = REJECTED_AFTER_PREFILL
            self.rejected_after_prefill += 1
            w = self._prefill_s[r]
            self.wasted_prefill_s += w
            self._recent_rejections.append(t)
            self._recent_waste.append((t, w))
            self._recent_waste_sum += w

    def _decode_done(self, t: float, r: int) -> None:
        self._occupancy_changes(t)
        need = self._need[r]
        self._decode_used[self.decode_instance[r]] -= need
        self._used_total -= need
        del self._in_decode[r]

    def _view(self, i: int, now: float) -> AdmissionView:
        # least queued prefill instance (ties: lowest index)
        queues = []
        best, best_q = 0, math.inf
        for k, p in enumerate(self._prefill):
            q = p.busy_until - now
            if q < 0.0:
                q = 0.0
            queues.append(q)
            if q < best_q:
                best, best_q = k, q
        ps = self._prefill_s[i]
        finish = now + best_q + ps
        self._pending_instance = best
        # recent window
        cutoff = now - self.config.recent_window_s
        rej = self._recent_rejections
        while rej and rej[0] < cutoff:
            rej.popleft()
        waste = self._recent_waste
        while waste and waste[0][0] < cutoff:
            self._recent_waste_sum -= waste.popleft()[1]
        if not waste:
            self._recent_waste_sum = 0.0
        c = self.config
        return _new_tuple(AdmissionView, (
            now, i, self._input[i], self._output[i] if c.oracle else None,
            self._used_total, c.pool_capacity_tokens, tuple(self._decode_used), c.decode_capacity_tokens,
            tuple(queues), best, ps, finish, finish - now, c.ttft_slo_s,
            len(rej), len(waste), self._recent_waste_sum,
            self.admitted - self.completed - self.rejected_after_prefill, len(self._in_decode),
            self.mean_decode_s, self.mean_output_tokens, self,
        ))

    # -- projections used by the predictive policies (read-only) --------------------------------
    def decode_survival(self, x_s: float) -> float:
        """P(decode time > ``x_s``) over the workload's output lengths."""
        if x_s < 0:
            return 1.0
        k = int(x_s / self.config.tbt_s)
        s = self._survival
        return s[k] if k < len(s) else 0.0

    def project_decode_tokens(self, at_s: float, decode_s: float | None = None,
                              output_tokens: float | None = None) -> float:
        """See :meth:`AdmissionView.project_decode_tokens`."""
        return self.decode_token_projections(at_s, decode_s, output_tokens)[0]

    def expected_decode_tokens(self, at_s: float, output_tokens: float | None = None) -> float:
        """See :meth:`AdmissionView.expected_decode_tokens`."""
        return self.decode_token_projections(at_s, None, output_tokens)[1]

    def decode_token_projections(self, at_s: float, decode_s: float | None = None,
                                 output_tokens: float | None = None) -> tuple[float, float]:
        """``(project_decode_tokens(at_s, decode_s, output_tokens), expected_decode_tokens(at_s,
        output_tokens))`` in one pass over the requests in decode and in prefill: the Gym env's
        observation needs both at every step."""
        # ``x.__trunc__()`` is ``int(x)`` for a float (truncation toward zero) at a third of the
        # cost, and the terms that add nothing or exactly ``tokens`` skip the multiplication; each
        # sum is the same, term for term, in order, as its own loop would make it.
        td = self.mean_decode_s if decode_s is None else decode_s
        out = self.mean_output_tokens if output_tokens is None else output_tokens
        now = self.now
        surv = self._survival
        n_s = len(surv)
        inv_tbt = 1.0 / self.config.tbt_s
        uniform = expected = 0.0
        for start, tokens in self._in_decode.values():
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

    def _quantile_table(self, quantile: float) -> list[int]:
        """:func:`mooncake_gym.sim.metrics.quantile_table` of the workload, cached per quantile."""
        table = self._quantile_tables.get(quantile)
        if table is None:
            table = self._quantile_tables[quantile] = quantile_table(np.sort(np.asarray(self._output, dtype=np.int64)),
                                                                     quantile)
        return table

    def project_decode(self, at_s: float, decode_s: float | None = None, quantile: float | None = None,
                       output_tokens: float | None = None) -> list:
        """Projected used tokens of each decode instance at time ``at_s`` (see AdmissionView)."""
        c = self.config
        now = self.now
        cap = c.decode_capacity_tokens
        out = self.mean_output_tokens if output_tokens is None else output_tokens
        used = list(self._decode_used)
        n_decode = len(used)
        instance = self.decode_instance
        departures = []  # (estimated decode end, tokens, decode instance), those ending by at_s
        if quantile is None:
            td = self.mean_decode_s if decode_s is None else decode_s
            for r, (start, tokens) in self._in_decode.items():
                end = start + td
                if end <= at_s:
                    departures.append((end, tokens, instance[r]))
            new_decode_s = td
        else:
            table = self._quantile_table(quantile)
            n_t = len(table)
            tbt = c.tbt_s
            inv_tbt = 1.0 / tbt
            for r, (start, tokens) in self._in_decode.items():
                k = int((now - start) * inv_tbt)
                end = start + (table[k] if k < n_t else k + 1) * tbt
                if end <= at_s:
                    departures.append((end, tokens, instance[r]))
            new_decode_s = self.mean_decode_s if decode_s is None else decode_s
        heapq.heapify(departures)
        arrivals = []
        for fifo in self._prefill_fifo:
            for finish, r in fifo:
                if finish > at_s:
                    break
                arrivals.append((finish, r))
        arrivals.sort()
        inputs = self._input
        pop, push = heapq.heappop, heapq.heappush
        for finish, r in arrivals:
            while departures and departures[0][0] <= finish:
                _, tokens, j = pop(departures)
                used[j] -= tokens
            tokens = inputs[r] + out
            best, best_used = 0, used[0]
            for j in range(1, n_decode):
                if used[j] < best_used:
                    best, best_used = j, used[j]
            if best_used + tokens <= cap:
                used[best] = best_used + tokens
                end = finish + new_decode_s
                if end <= at_s:
                    push(departures, (end, tokens, best))
        while departures and departures[0][0] <= at_s:
            _, tokens, j = pop(departures)
            used[j] -= tokens
        return used

    # -- results ----------------------------------------------------------------------------------
    def result(self, policy: str = "policy") -> OverloadResult:
        """Metrics, outcomes and load series (complete once ``done``)."""
        c = self.config
        n = len(self._arrival)
        outcome = np.asarray(self.outcome, dtype=np.int8)
        horizon = self._horizon
        ttft = np.asarray(self.ttft_s, dtype=np.float64)
        completed_ttft = ttft[outcome == COMPLETED]
        prefill_load = np.asarray(self._samples_p, dtype=np.float64)
        decode_load = np.asarray(self._samples_d, dtype=np.float64)
        times = np.asarray(self._samples_t, dtype=np.float64)
        steady = times >= c.warmup_s
        corr = load_correlation(prefill_load[steady], decode_load[steady])
        starts = np.asarray(self.decode_start_s, dtype=np.float64)
        span = horizon - c.warmup_s
        steady_rate = (float(np.count_nonzero((starts >= c.warmup_s) & (starts <= horizon))) / span
                       if span > 0 else float("nan"))
        if horizon > 0:
            # time-weighted over [0, horizon]; before the run is done, over [0, the last change]
            span = horizon if self._done else max(self._occ_last_t, 1e-300)
            mean_occ = self._occ_area / span / c.pool_capacity_tokens
        else:
            mean_occ = float("nan")
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
            prefill_s=np.asarray(self._prefill_s, dtype=np.float64),
            prefill_instance=np.asarray(self.prefill_instance, dtype=np.int64),
            decode_instance=np.asarray(self.decode_instance, dtype=np.int64),
            decode_start_s=np.asarray(self.decode_start_s, dtype=np.float64),
            decode_end_s=np.asarray(self.decode_end_s, dtype=np.float64),
            sample_times_s=np.asarray(self._samples_t, dtype=np.float64),
            prefill_load=prefill_load,
            decode_load=decode_load,
            correlation=corr,
        )


def simulate(trace: Trace, policy: Callable, config: OverloadConfig | None = None, cost: CostModel | None = None,
             seed: int = 0) -> OverloadResult:
    """Run ``policy`` (``view -> bool``, admit) over ``trace``; ``policy.reset(rng)`` is called first."""
    if not callable(policy):
        raise ValueError(f"policy: expected a callable view -> bool, got {type(policy).__name__}")
    sim = OverloadSimulator(trace, config, cost)
    reset_policy(policy, seed)
    view = sim.reset()
    step = sim.step
    while view is not None:
        view = step(policy(view))  # step checks the answer (check_admit)
    return sim.result(policy_name(policy))
