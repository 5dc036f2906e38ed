"""``sizesplit``: Algorithm 1 with a work penalty and a size split (a reference rule for issue 13's
routing agents; not in ``ROUTING_POLICIES``, so ``compare``'s tables are unchanged).

Near saturation a FIFO prefill instance that takes a long prompt blocks every short one behind it.
Size-interval task assignment (SITA; Harchol-Balter, Crovella and Murta, "On choosing a task
assignment policy for a distributed server system", JPDC 59, 1999) keeps long jobs away from short
ones. Here: a request whose smallest service time over the instances (transfer + prefill, as
Algorithm 1 estimates it) exceeds ``long_s`` may go only to the first ``long_instances`` instances;
every request then goes to the instance with the least ``estimate + work_weight * service``
(Algorithm 1's TTFT estimate plus its own work there, weighted: work on a slow instance costs the
requests behind it more).
"""

from __future__ import annotations

from mooncake_gym.routing import Route, RoutingView

from .routing import KVCentric


class SizeSplit(KVCentric):
    """``sizesplit`` (module docstring). ``long_s=None`` disables the split; ``work_weight=0`` and no
    split is ``kvcentric`` with ``threshold``."""

    name = "sizesplit"

    def __init__(self, long_s: float | None = 1.5, long_instances: int = 2, work_weight: float = 0.0,
                 threshold: float = 1.0):
        super().__init__(threshold)
        if long_s is not None and not long_s > 0:
            raise ValueError(f"long_s: expected a time > 0 seconds or None, got {long_s!r}")
        if not (isinstance(long_instances, int) and long_instances >= 1):
            raise ValueError(f"long_instances: expected an integer >= 1, got {long_instances!r}")
        if not work_weight >= 0:
            raise ValueError(f"work_weight: expected a weight >= 0, got {work_weight!r}")
        self.long_s, self.long_instances, self.work_weight = long_s, long_instances, float(work_weight)

    def __call__(self, view: RoutingView) -> Route:
        estimates, pulls = self.estimates(view)
        services = [c - q for c, q in zip(estimates, view.queue_s)]
        costs = [c + self.work_weight * s for c, s in zip(estimates, services)]
        if self.long_s is not None and min(services) > self.long_s:
            k = min(self.long_instances, len(costs))
            costs = costs[:k] + [float("inf")] * (len(costs) - k)
        i = self._argmin(costs)
        return Route(i, pulls[i])

    def __repr__(self) -> str:
        return (f"SizeSplit(long_s={self.long_s!r}, long_instances={self.long_instances}, "
                f"work_weight={self.work_weight:g}, threshold={self.threshold:g})")
