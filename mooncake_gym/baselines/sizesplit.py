"""``sizesplit``: Algorithm 1 with a work penalty and a size split (the reference rule of issue 13's
routing agents; in ``ROUTING_POLICIES`` with ``relsplit`` since issue 26, so every routing table has them).

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

from mooncake_gym.sim.routing import Route, RoutingView

from mooncake_gym.baselines.routing import KVCentric


class SizeSplit(KVCentric):
    """``sizesplit`` (module docstring). ``long_s=None`` disables the split; ``work_weight=0`` and no
    split is ``kvcentric`` with ``threshold``."""

    name = "sizesplit"
    #: The knobs ``tune`` searches (the defaults among them).
    KNOBS = {"long_s": [0.8, 1.5, 3.0], "long_instances": [1, 2, 4], "work_weight": [0.0, 0.5]}

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
        if self._is_long(min(services)):
            k = min(self.long_instances, len(costs))
            costs = costs[:k] + [float("inf")] * (len(costs) - k)
        i = self._argmin(costs)
        return Route(i, pulls[i])

    def _is_long(self, size_s: float) -> bool:
        """Whether a request whose smallest service time is ``size_s`` counts as long."""
        return self.long_s is not None and size_s > self.long_s

    def __repr__(self) -> str:
        return (f"SizeSplit(long_s={self.long_s!r}, long_instances={self.long_instances}, "
                f"work_weight={self.work_weight:g}, threshold={self.threshold:g})")


class ServiceScale:
    """The running mean of the requests' smallest service times (s) in an episode: an exponential
    moving average with memory ``memory`` requests, bias-corrected (so the first requests get their
    plain mean). :meth:`ratio` gives a request's size relative to the requests before it, then
    counts it. A relative size does not change when every prompt gets longer (another trace, a
    slower GPU), where an absolute threshold in seconds does."""

    def __init__(self, memory: float = 1000.0):
        if not memory >= 1:
            raise ValueError(f"memory: expected a number of requests >= 1, got {memory!r}")
        self.decay = 1.0 - 1.0 / float(memory)
        self.reset()

    def reset(self) -> None:
        self._sum, self._weight = 0.0, 0.0

    @property
    def mean_s(self) -> float | None:
        """The running mean (None before the first request)."""
        return self._sum / self._weight if self._weight > 0 else None

    def ratio(self, size_s: float) -> float:
        """``size_s`` over the running mean of the earlier requests (1 for the first); then counts it."""
        mean = self.mean_s
        r = 1.0 if not mean else size_s / mean
        self._sum = self.decay * self._sum + size_s
        self._weight = self.decay * self._weight + 1.0
        return r


class RelativeSizeSplit(SizeSplit):
    """``sizesplit`` with a relative size threshold: a request is long when its smallest service
    time exceeds ``long_factor`` times the running mean of the episode's earlier requests'
    (:class:`ServiceScale`, memory ``memory`` requests), and, with ``min_load``, only while the
    work queued per instance is at least ``min_load`` such mean requests (a lightly loaded cluster
    has no queue for a long prompt to block). The rest is :class:`SizeSplit`."""

    name = "relsplit"
    #: The knobs ``tune`` searches: the defaults, and the teachers (6, 2, 0) and (2, 4, 3) of the cloned
    #: agents ``ppo_routing_ws`` and ``ppo_routing_bursty`` (retired: docs/routing-agents.md).
    KNOBS = {"long_factor": [2.0, 4.0, 6.0, 10.0], "long_instances": [1, 2, 4], "min_load": [0.0, 3.0]}

    def __init__(self, long_factor: float | None = 6.0, long_instances: int = 2, work_weight: float = 0.0,
                 threshold: float = 1.0, memory: float = 1000.0, min_load: float = 0.0):
        super().__init__(None, long_instances, work_weight, threshold)
        if long_factor is not None and not long_factor > 0:
            raise ValueError(f"long_factor: expected a ratio > 0 or None, got {long_factor!r}")
        if not min_load >= 0:
            raise ValueError(f"min_load: expected a number of mean requests >= 0, got {min_load!r}")
        self.long_factor, self.min_load = long_factor, float(min_load)
        self.scale = ServiceScale(memory)
        self._load_s = 0.0

    def reset(self, rng) -> None:
        super().reset(rng)
        self.scale.reset()

    def __call__(self, view: RoutingView) -> Route:
        self._load_s = sum(view.queue_s) / len(view.queue_s)
        return super().__call__(view)

    def _is_long(self, size_s: float) -> bool:
        mean = self.scale.mean_s or size_s
        r = self.scale.ratio(size_s)
        return self.long_factor is not None and r > self.long_factor and self._load_s >= self.min_load * mean

    def __repr__(self) -> str:
        return (f"RelativeSizeSplit(long_factor={self.long_factor!r}, long_instances={self.long_instances}, "
                f"work_weight={self.work_weight:g}, threshold={self.threshold:g}, "
                f"memory={1.0 / (1.0 - self.scale.decay):g}, min_load={self.min_load:g})")
