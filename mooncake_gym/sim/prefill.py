"""The prefill instance shared by both simulators: a FIFO server with an optional local prefix cache."""

from __future__ import annotations

from collections import deque

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

    __slots__ = ("index", "busy_until", "cache", "_finishes", "busy_s", "requests", "_tokens", "queued_tokens")

    def __init__(self, index: int, cache_blocks: int | None = None, cached: bool = True):
        self.index = index
        self.busy_until = 0.0
        self.cache = PrefixCache(cache_blocks) if cached else None
        self._finishes: deque[float] = deque()
        self.busy_s = 0.0
        self.requests = 0
        self._tokens: deque[int] = deque()  # computed tokens of each request in _finishes
        self.queued_tokens = 0

    def queue_s(self, now: float) -> float:
        """Seconds of work queued ahead of a request dispatched at ``now``."""
        q = self.busy_until - now
        return q if q > 0.0 else 0.0

    def queued_requests(self, now: float) -> int:
        """Requests dispatched here that have not finished by ``now`` (including the one in service)."""
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
        if b > now:
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
