"""Credit for queueing delay: each routing decision charged for the waits it imposes.

On a FIFO prefill instance that serves one request at a time, a waiting request's wait is made of
the services of the requests ahead of it: request q, arriving at ``a_q`` on instance i and starting
at ``s_q = a_q + wait_q``, waits exactly through the parts of the services ``[s_r, e_r]`` of the
earlier requests r on i that overlap ``[a_q, s_q]`` (they tile it: i is busy from ``a_q`` to
``s_q``). So with

    charge_r = service_r + sum over later q on r's instance of |[s_r, e_r] & [a_q, s_q]|

(``service_r = transfer_r + prefill_r``, the time r holds its instance), the charges of an episode
sum to exactly its total TTFT (``sum_r service_r + sum_q wait_q``): the episode's cost split by
decision, each request's wait paid by the requests that caused it rather than by the request that
suffers it. (A request's own TTFT plus what it imposes would count every wait twice.)

A charge is final once r's service has ended: a request that arrives after ``e_r`` does not wait
for r. :class:`QueueCredit` keeps the open charges of one episode from the simulator's rows (the
same on both engines) and pays out, at each decision, the charges that became final before the
next one. Batched prefill (``PrefillBatching``) is not FIFO service and has no such decomposition.
"""

from __future__ import annotations

import math
from collections import deque


class QueueCredit:
    """The open charges of one episode on ``n_instances`` FIFO instances (module docstring)."""

    __slots__ = ("_open",)

    def __init__(self, n_instances: int):
        # per instance, in service order: [request index, service start, service end, charge so far]
        self._open: list[deque] = [deque() for _ in range(n_instances)]

    def record(self, index: int, arrival_s: float, instance: int, queue_s: float, ttft_s: float) -> None:
        """Request ``index``, arrived at ``arrival_s``, was dispatched to ``instance``, where it waits
        ``queue_s`` and has its first token ``ttft_s`` after arrival. Its wait is charged to the
        requests of that instance whose service overlaps it (the open ones: :meth:`pay` has closed
        every request that ended before this arrival)."""
        line = self._open[instance]
        if queue_s > 0.0:
            for entry in line:
                start = entry[1] if entry[1] > arrival_s else arrival_s
                if entry[2] > start:
                    entry[3] += entry[2] - start
        line.append([index, arrival_s + queue_s, arrival_s + ttft_s, ttft_s - queue_s])

    def pay(self, now_s: float = math.inf) -> list[tuple[int, float]]:
        """Close and return ``(request index, charge s)`` of every request whose service ended by
        ``now_s`` (the next decision's time; the default closes all), in order of their ends."""
        paid = []
        for line in self._open:
            while line and line[0][2] <= now_s:
                k, _, end, charge = line.popleft()
                paid.append((end, k, charge))
        paid.sort()
        return [(k, charge) for _, k, charge in paid]

    def copy(self) -> "QueueCredit":
        out = QueueCredit(len(self._open))
        out._open = [deque([list(e) for e in line]) for line in self._open]
        return out


def queue_charges(arrival_s, instance, queue_s, ttft_s) -> list[float]:
    """Every request's charge (module docstring) from a whole run's per-request records, in the
    order of the requests (those of a ``RoutingResult``: ``arrival_s``, ``instance``, ``queue_s``,
    ``ttft_s``)."""
    n = len(arrival_s)
    credit = QueueCredit(int(max(instance)) + 1 if n else 0)
    charges = [0.0] * n
    for k in range(n):
        credit.record(k, float(arrival_s[k]), int(instance[k]), float(queue_s[k]), float(ttft_s[k]))
        for j, c in credit.pay(float(arrival_s[k + 1]) if k + 1 < n else math.inf):
            charges[j] = c
    return charges
