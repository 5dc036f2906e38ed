"""Decode instances of the cluster simulator: continuous batching (realistic) and reservation (lecture).

Both kinds share one interface, used by :class:`mooncake_gym.sim.cluster.ClusterSimulator`:

- ``accepts(tokens, now)``: the instance's own admission check for a request whose prompt holds
  ``tokens`` tokens of KV (Mooncake's decode instance checks its SLO before it takes a request);
- ``join(r, now, ...)``: the request's KV has arrived; it decodes from the next iteration on;
- ``next_event_s``: the time of the instance's next event (a request finishing, or KV running out),
  ``math.inf`` if none; ``on_event(now)`` handles it and returns the requests that ended;
- ``used_tokens(now)``, ``batch``, ``step_s()``: what a router or admitter sees.

Continuous batching (:class:`BatchingDecodeInstance`)
----------------------------------------------------
Each iteration produces one token for every request in the batch; its time comes from the cost
model, ``CostModel.decode_step_s(batch, context) = fixed(batch) + c * context``. A request occupies
its prompt plus the tokens generated so far, growing by one token per iteration (not its final
length reserved up front, which would need the output length: an oracle). Between two events the
batch is constant and its context grows by ``batch`` tokens per iteration, so iteration ``k`` takes
``alpha + beta * k`` seconds and the time of ``n`` iterations has a closed form: the simulator
jumps from event to event instead of iterating token by token.

- A request joins at the first iteration boundary at or after its KV has arrived (continuous
  batching adds requests between iterations).
- A request with ``output`` tokens needs ``output - 1`` decode iterations (prefill produced the
  first token). Its token intervals are: the first from its first token (the prefill's end) to the
  end of its first iteration (KV transfer + wait for the boundary + one iteration), then one
  iteration time each. TBT = mean of the slowest 10 % of those intervals (FAST'25 §5).
- KV running out: before an iteration whose new tokens would not fit, the most recently joined
  request is *preempted* (vLLM's default victim) until they fit. What happens to it is the
  instance's ``preemption`` mode (``ClusterPreset.preemption``):

  - ``"abort"``: it ends, counted (``Completion.preempted``; the cluster's ``PREEMPTED``);
  - ``"recompute"`` (vLLM's default): its KV is freed and it waits at the head of the instance's
    queue (new requests are refused while it waits); at the first event at which its prompt plus
    the tokens made so far and the next iteration fit, it rejoins, and that iteration is stalled by
    the recompute, the instance's prefill of those tokens (``CostModel.prefill_time``);
  - ``"swap"``: as ``"recompute"``, but its KV is copied to host memory over PCIe (the ``dram``
    tier's bandwidth, FAST'25's B_h2d) at the preemption, stalling that iteration, and back at the
    resumption, stalling that one.

  A stall lengthens the token interval of every request in the stalled iteration; a resumed
  request's interval across its wait is from its last token before the preemption to its next one.
  Each eviction is counted (``preemptions``), with the stalls' seconds (``preemption_stall_s``)
  and the recomputed tokens. A request that cannot fit even alone is aborted.

Reservation (:class:`ReservingDecodeInstance`, the ``lecture`` preset)
----------------------------------------------------------------------
The lecture's toy: a request reserves ``input + output`` tokens from its decode start and decodes
for ``output x tbt_s`` seconds; the batch does not change the speed. This is exactly
``mooncake_gym.sim.admission``'s decode pool.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque

import numpy as np

from mooncake_gym.model.costmodel import CostModel

#: TBT is the mean of the slowest ``TBT_TAIL_SHARE`` of a request's token intervals (FAST'25).
TBT_TAIL_SHARE = 0.10


def tail_means(offsets: np.ndarray, intervals: np.ndarray, share: float = TBT_TAIL_SHARE):
    """Per request q, whose token intervals are ``intervals[offsets[q]:offsets[q + 1]]``:
    ``(tbt, max, mean)`` arrays, TBT being the mean of the largest ``ceil(share x n)`` intervals
    (0 for a request without intervals). One vectorised pass over all requests."""
    offsets = np.asarray(offsets, dtype=np.int64)
    m = np.diff(offsets)
    # ascending within each request: each request's slice sorted in place (numpy's stable sort is a
    # merge of the ascending runs that the iterations between two events make); a few times faster
    # than one lexsort by (request, interval), with the same values
    v = np.array(intervals, dtype=np.float64)
    bounds = offsets.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b - a > 1:
            v[a:b].sort(kind="stable")
    k = np.ceil(share * m - 1e-9).astype(np.int64)
    ends = offsets[1:]
    some = m > 0
    safe_k, safe_m = np.maximum(k, 1), np.maximum(m, 1)
    # each request's sums from its own intervals only (np.add.reduceat over [start, end) pairs), so that
    # a request's TBT does not depend on which other requests are computed in the same pass
    padded = np.concatenate((v, [0.0]))
    top_sum = np.add.reduceat(padded, np.stack((ends - k, ends), axis=1).ravel())[::2] if len(m) else np.zeros(0)
    all_sum = np.add.reduceat(padded, np.stack((offsets[:-1], ends), axis=1).ravel())[::2] if len(m) else np.zeros(0)
    tbt = np.where(some, top_sum / safe_k, 0.0)
    mean = np.where(some, all_sum / safe_m, 0.0)
    top = v[np.maximum(ends - 1, 0)] if len(v) else np.zeros(len(m))
    return tbt, np.where(some, top, 0.0), mean


class Completion:
    """A request that ended on a decode instance: ``r``, ``end_s``, ``preempted``, and its TBT
    (``tbt_s``) where the instance knows it at once (``None``: computed in one pass at the end,
    :meth:`BatchingDecodeInstance.token_intervals`)."""

    __slots__ = ("r", "end_s", "preempted", "tbt_s")

    def __init__(self, r: int, end_s: float, preempted: bool = False, tbt_s: float | None = None):
        self.r, self.end_s, self.preempted, self.tbt_s = r, end_s, preempted, tbt_s


class BatchingDecodeInstance:
    """One decode instance running continuous batching; see the module docstring.

    State at the last event: wall time ``t0`` at iteration boundary ``it0``. Request r joined at
    boundary ``j_r`` with ``c_r`` tokens of context, so at boundary k it holds ``c_r + k - j_r``
    tokens and the batch holds ``k_base + batch * k`` with ``k_base = sum(c_r - j_r)``.
    """

    def __init__(self, index: int, cost: CostModel, capacity_tokens: int, tbt_slo_s: float,
                 max_running: int = 1 << 30, preemption: str = "abort"):
        if preemption not in ("abort", "recompute", "swap"):
            raise ValueError(f"preemption: expected 'abort', 'recompute' or 'swap', got {preemption!r}")
        self.preemption = preemption
        self.preemptions = 0  # evictions that re-queue (recompute or swap)
        self.preemption_stall_s = 0.0  # seconds of iterations stalled by recomputes and swaps
        self.recomputed_tokens = 0
        # preempted requests waiting for room, in order: (r, context tokens, iterations left, last token
        # time, earlier stints' rows)
        self.waiting: deque[tuple] = deque()
        self._stints: dict[int, list[tuple]] = {}  # r -> rows of its stints before the last preemption
        self._stalls: list[tuple[int, float]] = []  # (boundary, seconds): the iteration from it stalled
        self._stall_k = -1  # the boundary whose iteration the last stall holds, and its seconds
        self._stall_s = 0.0
        self.index = index
        self.cost = cost
        self.capacity_tokens = int(capacity_tokens)
        self.max_running = int(max_running)  # most requests running or arriving (the preset's max_running)
        self.pending_requests = 0  # accepted requests whose KV is still being transferred here
        self.tbt_slo_s = tbt_slo_s
        self._coefficients: dict[int, tuple[float, float]] = {}
        self.t0 = 0.0
        self.it0 = 0
        self.batch = 0
        self.k_base = 0
        self._ab_now: tuple[float, float] | None = None  # _ab() of the current batch, None: to compute
        self.pending_tokens = 0  # KV of accepted requests still being transferred here
        self._members: dict[int, tuple] = {}  # r -> (join boundary, context at join, finish boundary, join order,
        #                                      first token time, wall time of the join boundary, first segment)
        self._finishes: list = []  # (finish boundary, join order, r)
        self._order = 0
        self._segments: list[tuple] = []  # (first iteration, end iteration, alpha, beta): steps alpha + beta * k
        self.next_event_s = math.inf
        self.version = 0
        self.busy_s = 0.0
        self._context_now: float | None = None  # the last _context_tokens(now) and its value, valid for _context_version
        self._context_version = -1
        self._context_value = 0
        self._context_params = (0.0, 0.0, 0.0)
        self.finished: list[tuple] = []  # (r, first boundary, end boundary, first segment, wait before boundary,
        #                                  slowest iteration)
        self._tops: list[float] = []  # decreasing: the slowest iteration of the segments from _tops_at[i] on
        self._tops_at: list[int] = []

    # -- iteration arithmetic ------------------------------------------------------------------
    def _ab(self) -> tuple[float, float]:
        """``(alpha, beta)`` of the current batch: iteration k takes alpha + beta * k seconds
        (computed once per batch: ``join`` and ``_leave`` reset it)."""
        ab = self._ab_now
        if ab is None:
            b = self.batch
            co = self._coefficients.get(b)
            if co is None:
                co = self._coefficients[b] = self.cost.decode_step_coefficients(b)
            fixed, per_token = co
            ab = self._ab_now = (fixed + per_token * self.k_base, per_token * b)
        return ab

    def _iterations_within(self, dt: float, alpha: float, beta: float) -> int:
        """The most iterations from ``it0`` that end within ``dt`` seconds of ``t0``.

        Iterations ``it0 .. it0 + n - 1`` take ``n * (alpha + beta * it0) + beta * n * (n - 1) / 2``
        seconds (the "time of n" below); the hot paths write that expression out rather than call a
        method, always in this order of operations, so the floats agree wherever it is computed."""
        if dt <= 0:
            return 0
        a = alpha + beta * self.it0 - beta / 2  # time(n) = a n + (beta / 2) n^2
        if beta > 0:
            n = int((-a + math.sqrt(a * a + 2 * beta * dt)) / beta)
        else:
            n = int(dt / a)
        first = alpha + beta * self.it0  # the time of n = n * first + beta * n * (n - 1) / 2
        while n > 0 and n * first + beta * n * (n - 1) / 2 > dt:
            n -= 1
        while (n + 1) * first + beta * (n + 1) * n / 2 <= dt:
            n += 1
        return n

    def _advance_to(self, k: int) -> None:
        """Move the state to boundary ``k >= it0`` (no event in between), recording the segment."""
        it0 = self.it0
        n = k - it0
        if n <= 0:
            return
        alpha, beta = self._ab_now or self._ab()
        dt = n * (alpha + beta * it0) + beta * n * (n - 1) / 2  # the time of n (_iterations_within)
        segments = self._segments
        segments.append((it0, k, alpha, beta))
        # the suffix maxima of the segments' slowest iterations (a decreasing stack), for tbt_within
        x0, x1 = alpha + beta * it0, alpha + beta * (k - 1)
        top = x0 if x0 > x1 else x1
        tops, at = self._tops, self._tops_at
        while tops and tops[-1] <= top:
            tops.pop()
            at.pop()
        tops.append(top)
        at.append(len(segments) - 1)
        self.t0 += dt
        self.busy_s += dt
        self.it0 = k

    # -- what a policy sees ------------------------------------------------------------------------
    def _context_tokens(self, now: float | None) -> int:
        """Tokens of the batch's contexts at the last iteration boundary at or before ``now``."""
        b = self.batch
        if not b:
            return 0
        t0 = self.t0
        if now is None or now <= t0:
            return self.k_base + b * self.it0
        if self._context_version == self.version:  # the batch's constants of this state, computed once
            if self._context_now == now:
                return self._context_value
            first, h, lin = self._context_params
        else:
            co = self._coefficients.get(b)
            if co is None:
                co = self._coefficients[b] = self.cost.decode_step_coefficients(b)
            h = co[1] * b / 2  # iteration k takes alpha + 2 h k
            first = co[0] + co[1] * self.k_base + 2 * h * self.it0
            lin = first - h
            self._context_params = (first, h, lin)
            self._context_version = self.version
        dt = now - t0
        # n iterations take n * first + h n (n - 1) = (first - h) n + h n^2: the largest n within dt
        n = int((-lin + math.sqrt(lin * lin + 4 * h * dt)) / (2 * h)) if h > 0 else int(dt / first)
        if n * first + h * n * (n - 1) > dt:  # float rounding: off by at most one either way
            n -= 1
        elif (n + 1) * first + h * (n + 1) * n <= dt:
            n += 1
        value = self.k_base + b * (self.it0 + n)
        self._context_now, self._context_value = now, value
        return value

    def used_tokens(self, now: float | None = None) -> int:
        """KV tokens held at ``now``: the batch's contexts plus the KV of accepted requests still in
        transfer (``now=None``: at the last event)."""
        if now == self._context_now and self._context_version == self.version and now is not None:
            return self._context_value + self.pending_tokens  # read at this time already (the view's fields)
        return self._context_tokens(now) + self.pending_tokens

    def step_s(self, now: float | None = None, extra_requests: int = 0, extra_tokens: int = 0) -> float:
        """Time of the iteration running at ``now``, or, with ``extra_requests`` more requests holding
        ``extra_tokens`` more tokens, of an iteration with them (the predicted TBT after adding a
        request: Mooncake's decode-side check). 0 for an empty batch."""
        b = self.batch + extra_requests
        if b == 0:
            return 0.0
        co = self._coefficients.get(b)
        if co is None:
            co = self._coefficients[b] = self.cost.decode_step_coefficients(b)
        if now == self._context_now and self._context_version == self.version and now is not None:
            context = self._context_value  # read at this time already (the view's fields)
        else:
            context = self._context_tokens(now)
        return co[0] + co[1] * (context + self.pending_tokens + extra_tokens)

    def step_if_accepted(self, tokens: int, now: float | None = None, check_tbt: bool = True) -> float | None:
        """The predicted iteration time once a request with a prompt of ``tokens`` joins, if the
        instance accepts it at ``now``, else None. It accepts when the prompt plus one iteration of
        the grown batch fit in its KV and (with ``check_tbt``) that iteration time is within the TBT
        SLO (Mooncake's decode-side check)."""
        if self.waiting:  # preempted requests come first
            return None
        context = self._context_tokens(now) + self.pending_tokens + tokens
        b = self.batch + 1
        if context + b > self.capacity_tokens or b + self.pending_requests > self.max_running:
            return None
        co = self._coefficients.get(b)
        if co is None:
            co = self._coefficients[b] = self.cost.decode_step_coefficients(b)
        step = co[0] + co[1] * context
        return None if check_tbt and step > self.tbt_slo_s else step

    def load(self, now: float, tokens: int) -> tuple:
        """``(batch, used_tokens(now), step_s(now), step_s(now, 1, tokens))`` in one call: what a
        router or admitter reads of the instance for a request of ``tokens`` prompt tokens."""
        b = self.batch
        if not b:  # _context_tokens(now)'s cheap cases, inlined
            used = self.pending_tokens
        elif now <= self.t0:
            used = self.k_base + b * self.it0 + self.pending_tokens
        else:
            used = self._context_tokens(now) + self.pending_tokens
        coefficients = self._coefficients
        co = coefficients.get(b + 1)
        if co is None:
            co = coefficients[b + 1] = self.cost.decode_step_coefficients(b + 1)
        step_with = co[0] + co[1] * (used + tokens)
        if not b:
            return 0, used, 0.0, step_with
        co = coefficients.get(b)
        if co is None:
            co = coefficients[b] = self.cost.decode_step_coefficients(b)
        return b, used, co[0] + co[1] * used, step_with

    def accepts(self, tokens: int, now: float | None = None, check_tbt: bool = True) -> bool:
        """Whether :meth:`step_if_accepted` accepts the request."""
        return self.step_if_accepted(tokens, now, check_tbt) is not None

    # -- changes -------------------------------------------------------------------------------
    def reserve(self, tokens: int) -> None:
        self.pending_tokens += tokens
        self.pending_requests += 1

    def join(self, r: int, now: float, tokens: int, output_tokens: int, first_token_s: float,
             reserved: int = 0) -> list[Completion]:
        """Request ``r`` (``tokens`` of prompt KV, ``output_tokens`` to produce in all, its first
        token at ``first_token_s``) joins at the first boundary at or after ``now``; returns the
        requests that ended at that boundary (finishes at the same boundary come first)."""
        self.pending_tokens -= reserved
        if reserved:
            self.pending_requests -= 1
        ended: list[Completion] = []
        t0 = self.t0
        if self.batch == 0:
            if now > t0:
                self.t0 = now
        elif now > t0:
            alpha, beta = self._ab_now or self._ab()
            n = self._iterations_within(now - t0, alpha, beta)
            if t0 + (n * (alpha + beta * self.it0) + beta * n * (n - 1) / 2) < now:  # t0 + the time of n
                n += 1  # mid-iteration: wait for the boundary
            ended = self._finish_until(self.it0 + n)
        k = self.it0
        if output_tokens <= 1:  # nothing to decode: the prefill produced its only token
            ended.append(Completion(r, self.t0, tbt_s=0.0))
            self._reschedule()
            return ended
        self._add(r, k, tokens, output_tokens - 1, first_token_s)
        if self.k_base + self.batch * (k + 1) > self.capacity_tokens - self.pending_tokens:  # _make_room's test
            ended += self._make_room()
        if self.waiting:
            ended += self._resume()
        self._reschedule()
        return ended

    def _add(self, r: int, k: int, tokens: int, iterations: int, first_token_s: float) -> None:
        """Request ``r`` joins the batch at boundary ``k`` (the current one) with ``tokens`` of
        context and ``iterations`` to decode; its last token came at ``first_token_s``."""
        order = self._order = self._order + 1
        f = k + iterations
        self._members[r] = (k, tokens, f, order, first_token_s, self._wall(), len(self._segments))
        heapq.heappush(self._finishes, (f, order, r))
        self.batch += 1
        self.k_base += tokens - k
        self._ab_now = None

    def _wall(self) -> float:
        """The wall time of the current boundary, before any stall held there (a stall is in the
        next interval of every request in the stalled iteration)."""
        return self.t0 - self._stall_s if self._stall_k == self.it0 else self.t0

    def _stall(self, seconds: float) -> None:
        """Hold the iteration starting at the current boundary for ``seconds`` (a recompute or a swap)."""
        if seconds <= 0.0:
            return
        k = self.it0
        self._stalls.append((k, seconds))
        if self._stall_k == k:
            self._stall_s += seconds
        else:
            self._stall_k, self._stall_s = k, seconds
        self.t0 += seconds
        self.busy_s += seconds
        self.preemption_stall_s += seconds
        self.version += 1

    def _swap_s(self, tokens: int) -> float:
        """One way of a swap: ``tokens`` of KV over the host link (PCIe; the ``dram`` tier)."""
        return self.cost.load_s(tokens, "dram")

    def _resume(self) -> list[Completion]:
        """Rejoin the preempted requests at the queue's head while they fit with the next iteration
        (the batch's and theirs); one that cannot fit even alone is aborted."""
        ended: list[Completion] = []
        waiting = self.waiting
        while waiting:
            r, tokens, iterations, last_s, stints = waiting[0]
            k = self.it0
            if self.k_base + self.batch * (k + 1) + tokens + 1 > self.capacity_tokens - self.pending_tokens:
                if self.batch or self.pending_tokens:
                    break  # waits for room
                waiting.popleft()  # it cannot fit even alone: aborted
                del self._stints[r]
                ended.append(Completion(r, self.t0, preempted=True))
                continue
            waiting.popleft()
            if self.preemption == "swap":
                stall = self._swap_s(tokens)
            else:
                stall = self._recompute_s(tokens)
                self.recomputed_tokens += tokens
            self._stall(stall)
            self._add(r, k, tokens, iterations, last_s)
        return ended

    def _recompute_s(self, tokens: int) -> float:
        """The instance's prefill of ``tokens`` tokens (a recompute after a preemption)."""
        return self.cost.prefill_time()(tokens, 0)

    def _finish_until(self, k: int) -> list[Completion]:
        """Advance to boundary ``k``, ending the requests whose last iteration ends by then."""
        ended = []
        fin = self._finishes
        members = self._members
        pop = heapq.heappop
        while fin and fin[0][0] <= k:
            f, order, r = fin[0]
            if r not in members or members[r][3] != order:
                pop(fin)  # preempted earlier (and perhaps back since, with a new order)
                continue
            self._advance_to(f)
            pop(fin)
            ended.append(self._leave(r, preempted=False))
        if k > self.it0:
            self._advance_to(k)
        return ended

    def _leave(self, r: int, preempted: bool) -> Completion:
        j, c, f, _, first_token_s, join_wall_s, seg0 = self._members.pop(r)
        self.batch -= 1
        self.k_base -= c - j
        if self.batch == 0:
            self.k_base = 0
        self._ab_now = None
        if preempted:
            return Completion(r, self.t0, preempted=True)
        self.finished.append((r, j, f, seg0, join_wall_s - first_token_s, self._top_from(seg0)))
        return Completion(r, self.t0)

    def token_intervals(self, finished: list[tuple] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The token intervals of finished requests (default all, from ``finished``), in one
        vectorised pass: ``(requests, offsets, intervals)`` where request ``requests[q]``'s
        intervals are ``intervals[offsets[q]:offsets[q + 1]]``, in order. A request decoding
        iterations j .. f-1 has their times as intervals, the first plus the wait from its first
        token (the prefill's end) to boundary j."""
        rows = self.finished if finished is None else finished
        empty = np.zeros(0, np.int64)
        if not rows:
            return empty, np.zeros(1, np.int64), np.zeros(0)
        if self._stints or self._stalls:  # a preemption happened here: the slow path
            return self._intervals_with_stints(rows)
        base = min(x[3] for x in rows)  # segments before the first row's first one are not needed
        # columns through one float64 array each (C loops; the integers are far below 2**53: exact)
        segs = np.array(self._segments[base:] if base else self._segments, dtype=np.float64).reshape(-1, 4)
        a, b = segs[:, 0].astype(np.int64), segs[:, 1].astype(np.int64)
        alpha, beta = segs[:, 2], segs[:, 3]
        cols = np.array(rows, dtype=np.float64)
        req, j, f = cols[:, 0].astype(np.int64), cols[:, 1].astype(np.int64), cols[:, 2].astype(np.int64)
        seg0 = cols[:, 3].astype(np.int64) - base
        wait = cols[:, 4]
        seg1 = np.searchsorted(a, f, side="left")  # segments starting before f
        n_pairs = seg1 - seg0
        owner = np.repeat(np.arange(len(rows)), n_pairs)
        seg = np.arange(int(n_pairs.sum())) - np.repeat(np.cumsum(n_pairs) - n_pairs, n_pairs) + np.repeat(seg0, n_pairs)
        lo = np.maximum(a[seg], j[owner])
        hi = np.minimum(b[seg], f[owner])
        counts = np.maximum(hi - lo, 0)
        total = int(counts.sum())
        ks = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(lo, counts)
        intervals = np.repeat(alpha[seg], counts) + np.repeat(beta[seg], counts) * ks
        offsets = np.zeros(len(rows) + 1, np.int64)
        offsets[1:] = np.cumsum(f - j)
        firsts = offsets[:-1][f > j]
        intervals[firsts] += wait[f > j]
        return req, offsets, intervals

    def _intervals_with_stints(self, rows: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`token_intervals` after preemptions: each row preceded by its request's earlier
        stints (merged into one request), and each stall added to its iteration's interval."""
        expanded: list[tuple] = []
        for row in rows:
            earlier = self._stints.get(row[0])
            if earlier:
                expanded += earlier
            expanded.append(row)
        stints, saved = self._stints, self._stalls
        self._stints, self._stalls = {}, []  # the fast path over the expanded rows
        try:
            req, offsets, intervals = self.token_intervals(expanded)
        finally:
            self._stints, self._stalls = stints, saved
        if saved:
            j = np.array([x[1] for x in expanded], dtype=np.int64)
            f = np.array([x[2] for x in expanded], dtype=np.int64)
            for k, seconds in saved:
                on = (j <= k) & (k < f)
                intervals[offsets[:-1][on] + (k - j[on])] += seconds
        keep = np.ones(len(req), dtype=bool)
        keep[1:] = req[1:] != req[:-1]  # a request's stints are consecutive: one request
        return req[keep], np.concatenate((offsets[:-1][keep], offsets[-1:])), intervals

    def tbt_within(self, row: tuple, slo_s: float) -> bool | None:
        """Whether the TBT of the finished request ``row`` (an entry of ``finished``) is at most
        ``slo_s``, decided in plain Python without building arrays; None when its TBT is within
        rounding distance (10**-9 relative) of ``slo_s``, where only the exact value
        (:meth:`token_intervals` and :func:`tail_means`, which sum in numpy's order) can tell.

        Its intervals are those of :meth:`token_intervals` (computed with the same operations, so
        the same floats); only the summation order differs, by far less than 10**-9 relative. When
        its slowest interval is clearly within the SLO, so is the mean of any of them."""
        r, j, f, seg0, wait, top = row
        if r in self._stints or (self._stalls and any(j <= k < f for k, _ in self._stalls)):
            return None  # preempted, or in a stalled iteration: only the exact value tells
        m = f - j
        if m <= 0:
            return 0.0 <= slo_s
        segs = self._segments
        alpha, beta = segs[seg0][2], segs[seg0][3]
        first = alpha + beta * j + wait
        if first > top:
            top = first
        low, high = slo_s * (1 - 1e-9), slo_s * (1 + 1e-9)
        if top <= low:
            return True
        intervals = []
        for s in range(seg0, len(segs)):
            lo, hi, alpha, beta = segs[s]
            if lo >= f:
                break
            intervals += [alpha + beta * k for k in range(lo, hi if hi < f else f)]
        intervals[0] += wait
        intervals.sort()
        k = math.ceil(TBT_TAIL_SHARE * m - 1e-9)
        tbt = sum(intervals[m - k:]) / k
        if tbt <= low:
            return True
        if tbt > high:
            return False
        return None

    def _make_room(self) -> list[Completion]:
        """Preempt the most recently joined requests until the next iteration's tokens fit."""
        ended = []
        while self.batch and self.k_base + self.batch * (self.it0 + 1) > self.capacity_tokens - self.pending_tokens:
            r = max(self._members, key=lambda q: self._members[q][3])
            if self.preemption == "abort":
                ended.append(self._leave(r, preempted=True))
            else:
                self._requeue(r)
        return ended

    def _requeue(self, r: int) -> None:
        """Preempt ``r`` to the waiting queue (recompute or swap): its stint so far is kept for its TBT."""
        j, c, f, _, first_token_s, join_wall_s, seg0 = self._members[r]
        k = self.it0
        row = (r, j, k, seg0, join_wall_s - first_token_s, self._top_from(seg0))
        self._leave(r, preempted=True)
        stints = self._stints.setdefault(r, [])
        if k > j:
            stints.append(row)
        # (no token in this stint: the wait since its last token carries over to the next)
        last_s = self._wall() if k > j else first_token_s
        tokens = c + (k - j)
        self.waiting.append((r, tokens, f - k, last_s, stints))
        self.preemptions += 1
        if self.preemption == "swap":
            self._stall(self._swap_s(tokens))

    def _top_from(self, seg0: int) -> float:
        """The slowest iteration of the segments from ``seg0`` on (``tbt_within``'s bound)."""
        k = bisect.bisect_left(self._tops_at, seg0)
        return self._tops[k] if k < len(self._tops) else -math.inf

    def _reschedule(self) -> None:
        self.version += 1
        b = self.batch
        if not b:
            self.next_event_s = math.inf
            return
        fin = self._finishes
        members = self._members
        while fin and (fin[0][2] not in members or members[fin[0][2]][3] != fin[0][1]):
            heapq.heappop(fin)
        f = fin[0][0]
        # first boundary whose iteration would overflow: k_base + batch (k + 1) > capacity - pending
        full = (self.capacity_tokens - self.pending_tokens - self.k_base) // b
        it0 = self.it0
        k = f if f < full else (full if full > it0 else it0)
        alpha, beta = self._ab_now or self._ab()
        n = k - it0
        self.next_event_s = self.t0 + (n * (alpha + beta * it0) + beta * n * (n - 1) / 2)  # t0 + the time of n
        self._next_boundary = k

    def on_event(self, now: float) -> list[Completion]:
        """Handle the event at ``next_event_s``: finishes at that boundary, then preemptions."""
        ended = self._finish_until(self._next_boundary)
        if self.batch and self.k_base + self.batch * (self.it0 + 1) > self.capacity_tokens - self.pending_tokens:
            ended += self._make_room()  # its test, inlined
        if self.waiting:
            ended += self._resume()
        self._reschedule()
        return ended


def fastest_accepting(instances: list[BatchingDecodeInstance], tokens: int, now: float, check_tbt: bool = True) -> int:
    """The index of the instance with the shortest predicted iteration time once a request with a
    prompt of ``tokens`` joins (:meth:`BatchingDecodeInstance.step_if_accepted`) among those that
    accept it at ``now``; the first such on ties; -1 if none accepts. The cluster's default decode
    rule.

    Instances are evaluated in order of a lower bound of their step: the same formula with their
    contexts at their last event (they only grow between events, and the step grows with them). The
    first evaluated is usually the winner, and the scan stops at the first bound above the best
    step found (a bound equal to it can still tie, and wins the tie only with a smaller index), so
    most instances never compute their contexts at ``now``. Idle instances all predict the same
    step: only the first is a candidate."""
    candidates = []  # (lower bound of the step with the request, index, coefficients of the grown batch)
    idle_seen = False
    for j, inst in enumerate(instances):
        b = inst.batch
        pending = inst.pending_tokens
        coefficients = inst._coefficients
        co = coefficients.get(b + 1)
        if co is None:
            co = coefficients[b + 1] = inst.cost.decode_step_coefficients(b + 1)
        if not b and not pending:
            if idle_seen:
                continue
            idle_seen = True
        candidates.append((co[0] + co[1] * (inst.k_base + b * inst.it0 + pending + tokens), j, co))
    candidates.sort()
    best, best_step = -1, math.inf
    for bound, j, co in candidates:
        if bound >= best_step:
            if bound > best_step:
                break  # neither this one nor any later one can reach the best step
            if j > best:
                continue  # at best it ties, and loses the tie to the smaller index
        # step_if_accepted(tokens, now, check_tbt), inlined
        inst = instances[j]
        if inst.waiting:  # preempted requests come first
            continue
        context = inst._context_tokens(now) + inst.pending_tokens + tokens
        if context + inst.batch + 1 > inst.capacity_tokens or inst.batch + 1 + inst.pending_requests > inst.max_running:
            continue
        step = co[0] + co[1] * context
        if check_tbt and step > inst.tbt_slo_s:
            continue
        if step < best_step or (step == best_step and j < best):
            best, best_step = j, step
    return best


class ReservingDecodeInstance:
    """The lecture's decode instance: ``input + output`` tokens reserved for ``output x tbt_s``.

    Its requests' ends are known when they join, so it keeps no events of its own: :meth:`hold`
    reserves a request's tokens and returns the time its decode ends, which the caller keeps as its
    own event and answers with :meth:`release` (the cluster simulator: one event per request, as
    the lecture's simulator had). ``batch`` counts the requests held."""

    __slots__ = ("index", "capacity_tokens", "tbt_s", "used", "batch", "pending_tokens", "next_event_s", "version",
                 "busy_s")

    def __init__(self, index: int, capacity_tokens: int, tbt_s: float):
        self.index = index
        self.capacity_tokens = int(capacity_tokens)
        self.tbt_s = tbt_s
        self.used = 0
        self.batch = 0
        self.pending_tokens = 0
        self.next_event_s = math.inf  # (no events of its own)
        self.version = 0
        self.busy_s = 0.0

    def used_tokens(self, now: float | None = None) -> int:
        return self.used

    def step_s(self, now: float | None = None, extra_requests: int = 0, extra_tokens: int = 0) -> float:
        return self.tbt_s if self.batch or extra_requests else 0.0

    def accepts(self, tokens: int, now: float | None = None, check_tbt: bool = True) -> bool:
        return self.used + tokens <= self.capacity_tokens

    def load(self, now: float, tokens: int) -> tuple:
        """``(batch, used_tokens(now), step_s(now), step_s(now, 1, tokens))`` in one call."""
        return self.batch, self.used, self.tbt_s if self.batch else 0.0, self.tbt_s

    def reserve(self, tokens: int) -> None:
        pass

    def hold(self, tokens: int, output_tokens: int, now: float) -> float:
        """Reserve ``tokens`` for a request joining at ``now`` with ``output_tokens`` to decode; returns
        the time its decode ends, ``now + output_tokens x tbt_s`` (call :meth:`release` then)."""
        self.used += tokens
        self.batch += 1
        return now + output_tokens * self.tbt_s

    def release(self, tokens: int) -> None:
        """A request holding ``tokens`` ended: free them."""
        self.used -= tokens
        self.batch -= 1
