"""The prefill instance shared by both simulators: a FIFO server with an optional local prefix cache,
and the engine that batches its queue per iteration (chunked prefill, :class:`PrefillEngine`)."""

from __future__ import annotations

import math
from collections import deque

from mooncake_gym.model.costmodel import PrefillTime
from mooncake_gym.sim.prefixcache import PrefixCache


class PrefillInstance:
    """One prefill instance: requests are served one at a time in arrival (FIFO) order.

    ``busy_until`` is the time the last dispatched request finishes, so the queued work at time
    ``now`` is ``max(0, busy_until - now)``: the sum of the remaining service times of everything
    already dispatched (Algorithm 1's T_queue). ``cache`` is the instance's local prefix cache
    (``None`` when the simulation does not model caching).

    ``queued_tokens`` sums the computed (uncached) prompt tokens of the requests counted by
    :meth:`queued_requests` (what production routers call active prefill tokens); it is current
    after a call to ``queued_requests(now)`` on a busy instance (an idle one holds none).
    """

    __slots__ = ("index", "busy_until", "cache", "_finishes", "busy_s", "requests", "_tokens", "queued_tokens",
                 "engine")

    def __init__(self, index: int, cache_blocks: int | None = None, cached: bool = True):
        self.index = index
        self.busy_until = 0.0
        self.cache = PrefixCache(cache_blocks) if cached else None
        self._finishes: deque[float] = deque()
        self.busy_s = 0.0
        self.requests = 0
        self._tokens: deque[int] = deque()  # computed tokens of each request in _finishes
        self.queued_tokens = 0
        self.engine: PrefillEngine | None = None  # set: the queue is batched per iteration (PrefillEngine)

    def queue_s(self, now: float) -> float:
        """Seconds of work queued ahead of a request dispatched at ``now``."""
        q = self.busy_until - now
        return q if q > 0.0 else 0.0

    def queued_requests(self, now: float) -> int:
        """Requests dispatched here that have not finished by ``now`` (including the one in service)."""
        if self.engine is not None:
            return self.engine.queued_requests(now)
        f = self._finishes
        while f and f[0] <= now:
            f.popleft()
            self.queued_tokens -= self._tokens.popleft()
        return len(f)

    def busy(self, now: float) -> bool:
        return self.busy_until > now

    def dispatch(self, now: float, service_s: float, tokens: int = 0) -> tuple[float, float]:
        """Queue a request of ``service_s`` seconds at ``now`` (``tokens`` computed prompt tokens);
        returns its (start, finish) times."""
        if self.busy_until > now:
            start = self.busy_until
        else:  # idle: everything dispatched before has finished
            start = now
            self._finishes.clear()
            self._tokens.clear()
            self.queued_tokens = 0
        finish = start + service_s
        self.busy_until = finish
        self._finishes.append(finish)
        self._tokens.append(tokens)
        self.queued_tokens += tokens
        self.busy_s += service_s
        self.requests += 1
        return start, finish


def pool_load(instances: list[PrefillInstance], now: float) -> tuple[tuple, tuple, tuple]:
    """Each instance's ``(queue_s(now), queued_requests(now), queued_tokens)`` as three tuples, in
    one pass (what a routing view shows at ``now``; an idle instance holds nothing). The hot path of
    every routing decision: an instance whose oldest request has not finished by ``now`` is read
    without walking its queue."""
    queue, queued, tokens = [], [], []
    for inst in instances:
        b = inst.busy_until
        if inst.engine is not None:  # a batching instance: its engine counts (busy_until: an estimate)
            queue.append(b - now if b > now else 0.0)
            queued.append(inst.engine.queued_requests(now))
            tokens.append(inst.queued_tokens)
        elif b > now:
            f = inst._finishes  # holds busy_until's request at least
            if f[0] <= now:
                inst.queued_requests(now)  # forget the requests finished by now
            queue.append(b - now)
            queued.append(len(f))
            tokens.append(inst.queued_tokens)
        else:
            queue.append(0.0)
            queued.append(0)
            tokens.append(0)
    return tuple(queue), tuple(queued), tuple(tokens)


class PrefillJob:
    """A prompt in a :class:`PrefillEngine`'s queue: request ``r``, tokens ``pos..n`` still to
    compute, computable from ``ready_s`` on (after its prefix pull), ``extra_s`` of per-request time
    (overhead, the cached prefix's load not hidden behind compute) spent in the iteration of its last
    chunk, ``est_s`` the estimate of its remaining time served alone."""

    __slots__ = ("r", "n", "pos", "ready_s", "extra_s", "est_s", "tokens", "pipelined")

    def __init__(self, r: int, n: int, pos: int, ready_s: float, extra_s: float, est_s: float,
                 pipelined: bool = False):
        self.r, self.n, self.pos, self.ready_s, self.extra_s, self.est_s = r, n, pos, ready_s, extra_s, est_s
        self.tokens = n - pos  # computed tokens in all
        self.pipelined = pipelined  # prefilled by chunked pipeline parallelism over the engine's group


class PrefillEngine:
    """Chunked prefill batching on one prefill instance, as vLLM and SGLang schedule it.

    Each model iteration takes up to ``budget`` new tokens from the queue in arrival order: the rest
    of the head prompt, or a chunk of it, then the next prompts (a prompt whose prefix pull has not
    arrived yet is passed over), until the budget is spent. An iteration of ``t`` tokens whose
    chunks' linear FLOPs take ``c`` seconds and attention ``a`` lasts ``PrefillTime.iteration_s(c, t, a)``
    (max(linear, weights read) + attention + all-reduces, element-wise traffic and the iteration
    overhead; the cost model by component) plus the per-request time (``extra_s``) of the prompts
    it ends; a prompt's first token comes at the end of the iteration holding its last chunk. A lone
    prompt whose chunks fill the budget takes exactly ``PrefillTime``'s time.

    Event-driven: an iteration is formed when it starts, from the prompts queued then, so a request
    arriving at ``t`` changes only iterations starting at or after ``t``. :meth:`advance` forms
    every iteration starting before ``t`` and appends ``(r, first token time)`` of the prompts they
    end to ``ended``. What a router reads of the instance is an estimate: ``busy_until`` = the
    formed iterations' end + each queued prompt's remaining time served alone (``est_s``).
    """

    __slots__ = ("budget", "time", "jobs", "est_s", "ended", "iterations", "timing", "inst", "waiting",
                 "_ends", "group", "pipeline_min_tokens", "send_s_per_token", "send_latency_s", "stage_overhead_s",
                 "blocked_until", "pipelined_runs")

    def __init__(self, budget: int, timing: PrefillTime, inst: PrefillInstance):
        if not timing.realistic:
            raise ValueError("prefill_token_budget: batching needs a realistic prefill cost model (CostModel.realistic)")
        self.budget = budget
        self.timing = timing
        self.inst = inst
        self.time = 0.0  # the end of the last formed iteration
        self.jobs: deque[PrefillJob] = deque()  # queued prompts (ended ones left behind the head: skipped)
        self.waiting = 0  # prompts in jobs not ended
        self.est_s = 0.0  # sum of their est_s
        self.ended: list[tuple[int, float]] = []  # (request, first token time) as iterations are formed
        self._ends: deque[tuple[float, int]] = deque()  # (first token time, tokens) of ended prompts, in order
        self.iterations = 0
        # chunked pipeline parallelism (set_pipeline): the engines of the group, in stage order
        self.group: list[PrefillEngine] = [self]
        self.pipeline_min_tokens = 0
        self.send_s_per_token = 0.0
        self.send_latency_s = 0.0
        self.stage_overhead_s = 0.0
        self.blocked_until = 0.0  # a pipelined prompt of the group holds this instance until then
        self.pipelined_runs = 0

    def set_pipeline(self, group: list[PrefillEngine], min_tokens: int, send_s_per_token: float,
                     send_latency_s: float, stage_overhead_s: float) -> None:
        """Prefill prompts of at least ``min_tokens`` computed tokens by chunked pipeline
        parallelism over ``group`` (this engine first): see :meth:`_pipeline`. An activation send
        between two stages takes ``send_latency_s + send_s_per_token x tokens``; each stage's
        iteration pays ``stage_overhead_s`` whole (the rest of an iteration is split by layers)."""
        self.group = group
        self.pipeline_min_tokens = min_tokens
        self.send_s_per_token = send_s_per_token
        self.send_latency_s = send_latency_s
        self.stage_overhead_s = stage_overhead_s

    def add(self, r: int, now: float, ready_s: float, n: int, h: int, est_s: float) -> None:
        """Queue request ``r`` (tokens ``h..n`` to compute, ready at ``ready_s``, ``est_s`` its
        prefill time served alone) at ``now``."""
        extra = est_s - self.timing._chunked_compute(n, h)
        pipelined = len(self.group) > 1 and n - h >= self.pipeline_min_tokens
        self.jobs.append(PrefillJob(r, n, h, ready_s, extra if extra > 0.0 else 0.0, est_s, pipelined))
        self.waiting += 1
        self.est_s += est_s
        inst = self.inst
        inst.queued_tokens += n - h
        inst.requests += 1
        start = self.time if self.time > now else now
        inst.busy_until = start + self.est_s

    def queued_requests(self, now: float) -> int:
        """Prompts queued or in an iteration at ``now`` (those ended by ``now`` forgotten)."""
        ends = self._ends
        while ends and ends[0][0] <= now:
            self.inst.queued_tokens -= ends.popleft()[1]
        return self.waiting + len(ends)

    def next_start(self) -> float:
        """When the next iteration can start: the last one's end, or the earliest time a queued
        prompt is ready (its pull arrived) if none is then; ``math.inf`` if none is known to be."""
        s = self.time if self.time > self.blocked_until else self.blocked_until
        first = math.inf
        for job in self.jobs:
            if job.pos < job.n:
                if job.ready_s <= s:
                    return s
                if job.ready_s < first:
                    first = job.ready_s
        return first if first > s else s

    def form(self, s: float) -> float:
        """Form the iteration starting at ``s`` (at or after :meth:`next_start`) from the prompts
        ready then; returns its end (a pipeline: when this instance is free again)."""
        jobs = self.jobs
        timing = self.timing
        left = self.budget
        compute = 0.0
        attention = 0.0
        tokens = 0
        extra = 0.0
        done: list[PrefillJob] = []
        for job in jobs:
            if job.pos >= job.n or job.ready_s > s:
                continue
            if job.pipelined:
                if tokens:
                    break  # its turn comes next, alone
                return self._pipeline(job, s)
            take = job.n - job.pos
            if take > left:
                take = left
            e = job.pos + take
            compute += timing.chunk_compute_s(job.pos, e)
            attention += timing.chunk_attention_s(job.pos, e)
            tokens += take
            left -= take
            if e == job.n:
                extra += job.extra_s
                done.append(job)
                self.est_s -= job.est_s
            else:  # a chunk: its remaining time served alone from here
                rest = timing._chunked_compute(job.n, e) + job.extra_s
                self.est_s += rest - job.est_s
                job.est_s = rest
            job.pos = e
            if left == 0:
                break
        dur = timing.iteration_s(compute, tokens, attention) + extra
        end = s + dur
        self.time = end
        self.iterations += 1
        inst = self.inst
        inst.busy_s += dur
        for job in done:
            self.ended.append((job.r, end))
            self._ends.append((end, job.tokens))
        self.waiting -= len(done)
        while jobs and jobs[0].pos >= jobs[0].n:
            jobs.popleft()
        if not self.waiting:
            self.est_s = 0.0
        inst.busy_until = end + self.est_s if self.waiting else end
        return end

    def _pipeline(self, job: PrefillJob, s: float) -> float:
        """Chunked pipeline parallelism (Mooncake v3 §5.1): the prompt's chunks of at most
        ``budget`` tokens flow through the group's P instances, each holding 1/P of the layers.
        Chunk c's stage takes (its iteration's time less the iteration overhead) / P plus the
        overhead; it goes to the next stage after the activation send; a stage takes chunk c once
        it has finished chunk c - 1. This engine is stage 0, the group's others the next stages in
        order. The pipeline starts when every instance of the group is free, and each is held from
        then until its stage has finished the last chunk (its queue waits); the first token comes
        when the last stage has, plus the request's overhead. Returns when this instance is free."""
        timing = self.timing
        group = self.group
        start = s
        for mate in group:
            if mate.time > start:
                start = mate.time
        p_stages = len(group)
        ovh = self.stage_overhead_s
        finish = [start] * p_stages  # each stage's last finish
        busy = 0.0
        pos = job.pos
        while pos < job.n:
            e = pos + self.budget
            if e > job.n:
                e = job.n
            t = e - pos
            stage = (timing.iteration_s(timing.chunk_compute_s(pos, e), t, timing.chunk_attention_s(pos, e)) - ovh
                     ) / p_stages + ovh
            send = self.send_latency_s + self.send_s_per_token * t
            ready = start  # the chunk enters stage 0 at once
            for k in range(p_stages):
                begin = ready if ready > finish[k] else finish[k]
                finish[k] = begin + stage
                ready = finish[k] + send
            busy += stage
            pos = e
        end = finish[p_stages - 1] + job.extra_s
        job.pos = job.n
        self.est_s -= job.est_s
        for k in range(1, p_stages):
            mate = group[k]
            free = finish[k]
            if free > mate.blocked_until:
                mate.blocked_until = free
            mate.inst.busy_s += busy
            mate.inst.busy_until = free + mate.est_s if mate.waiting else free
        free = finish[0]
        self.time = free
        self.iterations += 1
        self.pipelined_runs += 1
        self.inst.busy_s += busy + job.extra_s
        self.ended.append((job.r, end))
        self._ends.append((end, job.tokens))
        self.waiting -= 1
        jobs = self.jobs
        while jobs and jobs[0].pos >= jobs[0].n:
            jobs.popleft()
        if not self.waiting:
            self.est_s = 0.0
        self.inst.busy_until = free + self.est_s if self.waiting else end
        return free

    def advance(self, t: float) -> None:
        """Form every iteration that starts before ``t``."""
        while self.waiting:
            s = self.next_start()
            if s >= t:
                break
            self.form(s)
        # (busy_until, the estimate, changes only at add and form: the same whoever drives the engine)

    def ready(self, r: int, t: float) -> None:
        """Request ``r``'s pull arrived at ``t`` (it was queued with ``ready_s`` = ``math.inf``)."""
        for job in self.jobs:
            if job.r == r and job.pos < job.n:
                job.ready_s = t
                return
        raise AssertionError(f"ready: request {r} is not queued here")
