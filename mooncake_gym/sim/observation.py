"""What a router sees: one layer between a simulator's exact decision view and the policy.

The routing simulator (``mooncake_gym.sim.routing``) knows, at each arrival, every instance's queued
work and prefix hit exactly, and the cost model's estimates are exact there. No deployed router
has that. An :class:`Observer`, configured by an :class:`ObservationConfig`, turns the exact
:class:`~mooncake_gym.sim.routing.RoutingView` into the view a router would really have: an object of
the same class with the same fields, so every baseline, the environments and trained agents work
unchanged. Only what the policy *sees* changes; a dispatched request is served exactly as before
(its queue, prefix hit, transfer and prefill are the simulator's truth).

Modes (``ObservationConfig.mode``; the parts combine with ``+``, e.g. ``"scraped+approximate+noisy"``):

``exact`` (default)
    The simulator's view itself: nothing is copied, the numbers are bit for bit those of a run
    without the layer.

``scraped`` -- load signals from periodic snapshots, plus the router's own in-flight counters
    ``queue_s``, ``queued_requests`` and ``queued_tokens`` (the load signals of this view) are
    read from snapshots of the instances taken every ``scrape_period_s`` seconds (at times
    ``k * scrape_period_s``) and seen ``scrape_delay_s`` late. At a decision at time ``now`` the
    router holds the latest snapshot taken at ``t_s <= now - scrape_delay_s`` and estimates, for
    each instance ``i``::

        queue_s[i]         = max(0, Q_i(t_s) - (now - t_s)) + sum of S_j over requests j this router
                             sent to i after the snapshot was taken
        queued_requests[i] = N_i(t_s) + number of those requests
        queued_tokens[i]   = C_i(t_s) + sum of c_j over those requests

    where ``Q_i(t_s)``, ``N_i(t_s)`` and ``C_i(t_s)`` are the instance's queued work, unfinished
    requests and their computed prompt tokens in the snapshot, ``S_j`` is the service time the router
    estimated for request ``j`` when it sent it (its view's ``prefill_s``, or ``transfer_s +
    pull_prefill_s`` for a pull, so it carries the errors of the other modes) and ``c_j`` the tokens
    it expected to be computed (input minus the hit it saw). The snapshot part is aged by the time elapsed since it was taken
    (the instance is assumed to have worked throughout); the in-flight part is not aged: it is
    corrected only when a later snapshot covers those requests. With exact service estimates the
    result is exact while the snapshot's queued work outlasts the elapsed time, and too high
    otherwise (the work done since on the requests sent is not subtracted). ``inflight=False`` drops
    the in-flight part (the stale snapshot, aged, alone). With ``scrape_period_s=0`` a snapshot is
    taken at every decision; with period 0 and delay 0 the view is exactly the exact one.
    Imitates: llm-d's endpoint picker (and the Gateway API Inference Extension it builds on), which
    polls each model server's metrics (waiting queue, KV-cache use) every ``refreshMetricsInterval``,
    50 ms by default (``pkg/epp/server/runserver.go``, ``DefaultRefreshMetricsInterval``), with
    router-side counts of the requests it has sent in the manner of NVIDIA Dynamo's KV router, which
    tracks the blocks and prefill tokens of the requests it routed (Dynamo docs, "Router Design",
    block tracking; Dynamo also decrements them when a request completes, which this model does not).
    ``routers=K`` (default 1) models K independent routers in front of the same instances (several
    gateway replicas): arriving request ``j`` (its position in the trace) goes to router
    ``j mod K`` (round robin), and each router has its own snapshots, taken at times
    ``k * scrape_period_s + r * scrape_period_s / K`` (router ``r``'s phase), and its own in-flight
    counters, of only the requests IT sent. A router therefore does not see what the others sent
    since its last snapshot, and routers that see the same idle instance all send to it: the herd
    effect of load balancing on stale, unshared information (Mitzenmacher, "How useful is old
    information?", IEEE TPDS 11(1), 2000). The prefix index (``approximate``, ``precise``) and the
    noise stay one for all routers. With ``routers=1`` the view is exactly the single router's above.

``approximate`` -- a router-side prefix index (no view of the caches)
    The router never reads the instances' caches: it keeps, per instance, an index of the blocks it
    routed there (all of a request's blocks, inserted when it sends the request, last block to
    first as the caches do), an LRU of ``index_capacity_blocks`` blocks (None: unbounded) whose
    entries also expire ``index_ttl_s`` seconds after the router last routed them (None: never).
    Hits then come from the index, so a block the instance has evicted but the index still holds
    makes the router overestimate the hit (and a block the index dropped early, underestimate it).
    With an unbounded index and no TTL it overestimates whenever a cache has evicted; if no cache
    ever evicts, the view is exactly the exact one.
    Imitates: SGLang's cache-aware router (``sgl-model-gateway``, ``src/policies/cache_aware.rs``:
    an approximate radix tree per worker built from the requests it routed, trimmed to
    ``--max-tree-size`` every ``--eviction-interval`` seconds), llm-d's approximate
    ``prefix-cache-scorer`` ("an in-memory LRU index of which prefix hashes were recently sent to
    which Pods", llm-d docs, "Prefix-Cache Aware Routing"), and Dynamo's router run with
    ``--no-kv-events`` (``ApproxKvIndexer``: blocks predicted from routing decisions, expiring after
    ``--router-ttl-secs``, 120 s by default).

``precise`` -- KV events from the instances, applied late
    The router's index is fed by the instances' KV-cache events (blocks stored and removed) and
    applies each ``kv_event_delay_s`` seconds after it happened: the index is every cache as it was
    ``kv_event_delay_s`` ago. In this simulator a cache changes when a request is dispatched to it
    (FIFO service makes that exact for every later request there), so with ``kv_event_delay_s=0``
    the view is exactly the exact one. The replicas replay the same insertions into caches of the
    same capacities, which is what applying the stored and removed events amounts to.
    Imitates: llm-d's ``precise-prefix-cache-scorer`` (its KV-Cache Indexer subscribes to vLLM's
    KVEvents over ZMQ; llm-d docs, "KV-Cache Indexer") and Dynamo's default KV router (``KvIndexer``
    fed by worker KV events over NATS or ZMQ; Dynamo docs, "Router Design").

``noisy`` -- errors on the cost model's predictions
    Each time estimate in the view that the cost model predicts -- ``prefill_s``, ``transfer_s`` and
    ``pull_prefill_s`` of every instance -- is multiplied by ``exp(noise_sigma * z)``, ``z``
    standard normal, drawn afresh per decision and instance (a log-normal error whose median is the
    true value; ``noise_sigma=0.3`` is about 30 % either way). Where a pull changes nothing
    (``transfer_s`` 0), ``pull_prefill_s`` stays equal to ``prefill_s``. ``queue_s`` is measured,
    not predicted, and stays as the other modes make it (with ``scraped`` its in-flight part sums
    the noisy estimates). The draws come from the run's seeded generator only (``simulate``: a
    generator spawned from its ``seed``; the environment: one spawned from its ``np_random``).
    Imitates: a router that ranks instances by a predicted TTFT, as Mooncake's Conductor does with
    its prefill-time model (Mooncake v3 §6, Algorithm 1); the error size is a knob, not a published
    figure.

How a simulator uses it (``RoutingSimulator`` does exactly this; another simulator that makes an
exact ``RoutingView`` can do the same): ``obs = Observer(config, instances, estimates, rng)``;
at each decision ``obs.scrape(now)`` before reading the instances at ``now``, then
``view = obs.observe(exact_view)`` for the policy; after dispatching,
``obs.dispatched(instance, pull)``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np

from mooncake_gym.model.limits import MAX_SCRAPE_SNAPSHOTS, check, check_bound
from mooncake_gym.sim.prefill import pool_load
from mooncake_gym.sim.prefixcache import PrefixCache, match_all
from mooncake_gym.sim.views import RoutingView

#: The parts a mode string may join with "+" ("exact" stands alone).
MODE_PARTS = ("scraped", "approximate", "precise", "noisy")


@dataclass(frozen=True)
class ObservationConfig:
    """What a routing policy sees (see the module docstring for each mode and its source).

    mode: ``"exact"`` or parts of ``"scraped"``, ``"approximate"`` | ``"precise"``, ``"noisy"``
        joined by ``"+"``.
    scrape_period_s: seconds between load snapshots (``scraped``; 0: one at every decision).
    scrape_delay_s: age of a snapshot when the router first sees it (``scraped``).
    inflight: add the router's own in-flight counters to the snapshot (``scraped``).
    index_capacity_blocks: blocks the router's index keeps per instance (``approximate``; None: unbounded).
    index_ttl_s: seconds after which an index entry not routed again expires (``approximate``; None: never).
    kv_event_delay_s: delay of the instances' KV events (``precise``). 0.1 s is an assumption
        (event batching and transport), not a published figure.
    noise_sigma: log-normal error size of the predicted times (``noisy``).
    routers: independent routers, each with its own snapshots and in-flight counters, requests
        assigned round robin (``scraped``; default 1).

    A setting changed from its default for a mode that ``mode`` does not include is a
    ``ValueError`` (it would have no effect).
    """

    mode: str = "exact"
    scrape_period_s: float = 0.1
    scrape_delay_s: float = 0.0
    inflight: bool = True
    index_capacity_blocks: int | None = None
    index_ttl_s: float | None = None
    kv_event_delay_s: float = 0.1
    noise_sigma: float = 0.3
    routers: int = 1

    def __post_init__(self):
        object.__setattr__(self, "_parts", None)
        object.__setattr__(self, "_parts", parts := self.parts)  # validated once, then kept
        if "approximate" in parts and "precise" in parts:
            raise ValueError(f"mode: 'approximate' and 'precise' are two prefix indexes; choose one, got {self.mode!r}")
        for name in ("scrape_period_s", "scrape_delay_s", "kv_event_delay_s"):
            check("observation_s", getattr(self, name), name)
        check("noise_sigma", self.noise_sigma)
        if self.index_ttl_s is not None:
            check("observation_s", self.index_ttl_s, "index_ttl_s")
            if self.index_ttl_s == 0:
                raise ValueError("index_ttl_s: expected > 0 seconds or None, got 0")
        if self.scrape_period_s > 0:  # each router holds the snapshots of the last delay + period
            check_bound("scrape_delay_s", self.scrape_delay_s / self.scrape_period_s + 1, MAX_SCRAPE_SNAPSHOTS,
                        "load snapshots held per router (scrape_delay_s / scrape_period_s)",
                        "lengthen scrape_period_s or shorten scrape_delay_s")
        cap = self.index_capacity_blocks
        if cap is not None and (not isinstance(cap, (int, np.integer)) or isinstance(cap, bool) or cap < 0):
            raise ValueError(f"index_capacity_blocks: expected an integer >= 0 or None, got {cap!r}")
        r = self.routers
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 1 <= r <= 1024:
            raise ValueError(f"routers: expected an integer in [1, 1024], got {r!r}")
        if not isinstance(self.inflight, bool):
            raise ValueError(f"inflight: expected True or False, got {self.inflight!r}")
        for f in fields(self):  # a setting of a mode not asked for would be silently ignored
            part = _FIELD_MODE.get(f.name)
            if part is not None and part not in parts and getattr(self, f.name) != f.default:
                raise ValueError(f"{f.name}: applies to mode '{part}', which mode {self.mode!r} does not include")

    @property
    def parts(self) -> frozenset:
        """The mode's parts (empty for ``"exact"``)."""
        if self._parts is not None:
            return self._parts
        if not isinstance(self.mode, str):
            raise ValueError(f"mode: expected a string, got {self.mode!r}")
        if self.mode.strip() == "exact":
            return frozenset()
        parts = [p.strip() for p in self.mode.split("+")]
        bad = [p for p in parts if p not in MODE_PARTS]
        if bad or not parts:
            raise ValueError(f"mode: expected 'exact' or parts of {list(MODE_PARTS)} joined by '+', got {self.mode!r}")
        return frozenset(parts)

    @property
    def exact(self) -> bool:
        return not self.parts

    @property
    def scraped(self) -> bool:
        return "scraped" in self.parts

    @property
    def prefix_index(self) -> str:
        """``"exact"``, ``"approximate"`` or ``"precise"``: where the view's prefix hits come from."""
        parts = self.parts
        return "approximate" if "approximate" in parts else "precise" if "precise" in parts else "exact"

    @property
    def noisy(self) -> bool:
        return "noisy" in self.parts

    @classmethod
    def parse(cls, text: str) -> "ObservationConfig":
        """``"MODE[,field=value...]"``, e.g. ``"scraped+noisy,scrape_delay_s=0.5,noise_sigma=0.3"``
        (the command line's ``--observation``). ``none`` reads as None for the optional fields."""
        head, *rest = [t.strip() for t in str(text).split(",")]
        kinds = {f.name: f for f in fields(cls)}
        kwargs = {"mode": head}
        for item in rest:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or key not in kinds or key == "mode":
                raise ValueError(f"observation: expected MODE[,field=value...] with fields of "
                                 f"{[k for k in kinds if k != 'mode']}, got {item!r} in {text!r}")
            value = value.strip()
            try:
                if value.lower() == "none":
                    kwargs[key] = None
                elif key == "inflight":
                    kwargs[key] = {"true": True, "false": False}[value.lower()]
                elif key in ("index_capacity_blocks", "routers"):
                    kwargs[key] = int(value)
                else:
                    kwargs[key] = float(value)
            except (ValueError, KeyError):
                raise ValueError(f"observation: {key}: cannot read {value!r} in {text!r}") from None
        return cls(**kwargs)


#: The mode each setting belongs to.
_FIELD_MODE = {"scrape_period_s": "scraped", "scrape_delay_s": "scraped", "inflight": "scraped",
               "index_capacity_blocks": "approximate", "index_ttl_s": "approximate",
               "kv_event_delay_s": "precise", "noise_sigma": "noisy", "routers": "scraped"}


def as_observation(observation) -> ObservationConfig:
    """An ``ObservationConfig`` from None (exact), a mode string (``ObservationConfig.parse``), a dict
    of its fields, or an ``ObservationConfig``."""
    if observation is None:
        return ObservationConfig()
    if isinstance(observation, ObservationConfig):
        return observation
    if isinstance(observation, str):
        return ObservationConfig.parse(observation)
    if isinstance(observation, dict):
        try:
            return ObservationConfig(**observation)
        except TypeError as e:
            raise ValueError(f"observation: {e}") from None
    raise ValueError(f"observation: expected None, a mode string, a dict or an ObservationConfig, "
                     f"got {type(observation).__name__}")


def observation_rng(seed) -> np.random.Generator:
    """The generator of a run's observation noise: spawned from ``seed``'s generator, so it is
    independent of the policy's (``reset_policy`` seeds the policy with ``default_rng(seed)``)."""
    parent = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return parent.spawn(1)[0]


class Observer:
    """Turns a simulator's exact views into what a router sees, for one run (see the module docstring).

    ``instances``: the simulator's instances (``prefill.PrefillInstance``: ``queue_s(t)``,
    ``queued_requests(t)``, ``cache``), read only by ``scrape``. ``estimates``: the simulator's
    ``routing.PrefixEstimates`` (the cost model), which turns believed hits into view fields.
    ``rng``: the generator of the noise.
    """

    def __init__(self, config: ObservationConfig, instances: Sequence, estimates, rng: np.random.Generator):
        self.config = config
        self.instances = instances
        self.estimates = estimates
        self.rng = rng
        self._scraped, self._noisy, self._kind = config.scraped, config.noisy, config.prefix_index
        self._factors: list[float] = []  # noise factors exp(sigma z), drawn in blocks, used from the end
        self._seen = None  # the last view handed to the policy
        n = len(instances)
        # scraped, per router: snapshots (time taken, dispatches before it, queue_s, queued_requests,
        # queued_tokens), oldest first; the first is always visible (at the start: an empty cluster,
        # known in advance)
        k = config.routers
        self._routers = k
        self._all_snapshots = [deque([(-math.inf, 0, (0.0,) * n, (0,) * n, (0,) * n)]) for _ in range(k)]
        self._all_next_k = [0] * k  # per router: index of its next periodic snapshot time
        # per router: (dispatch number, instance, estimated service s, computed tokens) of what it sent
        self._all_sent = [deque() for _ in range(k)]
        self._phase = [r * config.scrape_period_s / k for r in range(k)]  # router r's snapshot times: phase + k period
        self._router = 0  # the router of the last observed request
        self._dispatches = 0
        # prefix index: the router's per-instance block indexes
        kind = config.prefix_index
        self._stamps = None
        if kind == "approximate":
            self._index = [PrefixCache(config.index_capacity_blocks) for _ in range(n)]
            if config.index_ttl_s is not None:
                self._stamps = [{} for _ in range(n)]  # block -> last time the router routed it
        elif kind == "precise":
            self._index = [PrefixCache(inst.cache.capacity_blocks) for inst in instances]  # replicas
            self._events: deque = deque()  # (time applied, instance, block ids): pending insertions
        else:
            self._index = None

    # -- the simulator's calls ------------------------------------------------------------------
    def scrape(self, now: float) -> None:
        """Take the snapshots due by ``now``. Call before anything reads the instances at ``now``
        (``PrefillInstance.queued_requests`` forgets finished requests as time advances)."""
        if not self._scraped:
            return
        c = self.config
        period = c.scrape_period_s
        if period == 0:
            for snapshots in self._all_snapshots:
                snapshots.append(self._take(now))
            return
        # Only snapshots that some decision at or after ``now`` may hold are taken: the state between
        # two decisions is the state after the earlier one's dispatch, aged.
        for r, (snapshots, phase) in enumerate(zip(self._all_snapshots, self._phase)):
            next_k = self._all_next_k[r]
            first = max(next_k, math.floor((now - phase - c.scrape_delay_s) / period) - 1, 0)
            last = math.floor((now - phase) / period)
            for k in range(first, last + 1):
                snapshots.append(self._take(min(k * period + phase, now)))
            self._all_next_k[r] = max(next_k, last + 1)

    def _take(self, t: float) -> tuple:
        return (t, self._dispatches, *pool_load(self.instances, t))

    def observe(self, exact: RoutingView) -> RoutingView:
        """The view the policy sees for the exact view ``exact`` (a named tuple of the same class,
        with the fields the modes change replaced)."""
        changes: dict = {}
        now = exact.now
        self._router = exact.index % self._routers  # round robin over the trace's requests
        if self._scraped:
            self._scraped_load(exact, now, changes)
        if self._index is not None:
            self._believed_prefix(exact, now, changes)
        if self._noisy:
            self._noise(exact, changes)
        v = exact._replace(**changes)
        self._seen = v
        return v

    def dispatched(self, instance: int, pull: bool) -> None:
        """Record the dispatch of the last observed request to ``instance`` (with a pull or not)."""
        v = self._seen
        i = instance
        self._dispatches += 1
        if self._scraped and self.config.inflight:
            pulled = pull and v.best_hit_tokens > v.hit_tokens[i]
            service = v.transfer_s[i] + v.pull_prefill_s[i] if pulled else v.prefill_s[i]
            tokens = v.input_tokens - (v.best_hit_tokens if pulled else v.hit_tokens[i])
            self._all_sent[self._router].append((self._dispatches - 1, i, service, tokens))
        kind = self._kind
        if kind == "approximate":
            self._index[i].insert(v.block_ids)
            if self._stamps is not None:
                self._stamps[i].update(dict.fromkeys(v.block_ids, v.now))
        elif kind == "precise":
            self._events.append((v.now + self.config.kv_event_delay_s, i, v.block_ids))

    # -- the modes --------------------------------------------------------------------------------
    def _scraped_load(self, v, now: float, changes: dict) -> None:
        delay = self.config.scrape_delay_s
        snaps = self._all_snapshots[self._router]
        while len(snaps) > 1 and snaps[1][0] + delay <= now:
            snaps.popleft()
        t, seen_dispatches, queue, queued, tokens = snaps[0]
        sent = self._all_sent[self._router]
        while sent and sent[0][0] < seen_dispatches:  # already in the snapshot
            sent.popleft()
        elapsed = now - t
        q = [x - elapsed for x in queue]
        q = [x if x > 0.0 else 0.0 for x in q]
        if sent:
            n, m = list(queued), list(tokens)
            for _, i, service, computed in sent:
                q[i] += service
                n[i] += 1
                m[i] += computed
            queued, tokens = tuple(n), tuple(m)
        changes["queue_s"], changes["queued_requests"], changes["queued_tokens"] = tuple(q), queued, tokens

    def _believed_prefix(self, v, now: float, changes: dict) -> None:
        index = self._index
        ids = v.block_ids
        if self._kind == "precise":
            events = self._events
            while events and events[0][0] <= now:
                _, i, blocks = events.popleft()
                index[i].insert(blocks)
            ks = match_all(index, ids)
        elif self._stamps is None:
            ks = match_all(index, ids)
        else:  # a block counts while it is in the LRU and was routed within the TTL
            horizon = now - self.config.index_ttl_s
            ks = []
            for cache, stamps in zip(index, self._stamps):
                k = 0
                for b in ids:
                    if b not in cache or stamps[b] < horizon:
                        break
                    k += 1
                ks.append(k)
        (changes["hit_tokens"], changes["prefill_s"], changes["transfer_s"], changes["pull_prefill_s"],
         changes["best_hit_tokens"], changes["best_instance"]) = self.estimates.estimate(ks, v.input_tokens)
        changes["hit_blocks"] = tuple(ks)

    def _noise(self, v, changes: dict) -> None:
        n = v.n_instances
        factors = self._factors
        if len(factors) < 3 * n:  # draw a block: numpy's per-call cost dwarfs a few dozen numbers
            fresh = np.exp(self.config.noise_sigma * self.rng.standard_normal(max(3 * n, 4096))).tolist()
            factors[:0] = fresh[::-1]
        f = factors[-3 * n:][::-1]
        del factors[-3 * n:]
        prefill_s = changes.get("prefill_s", v.prefill_s)
        transfer_s = changes.get("transfer_s", v.transfer_s)
        pull_prefill_s = changes.get("pull_prefill_s", v.pull_prefill_s)
        prefill = tuple([p * f[i] for i, p in enumerate(prefill_s)])
        changes["pull_prefill_s"] = tuple([pp * f[n + i] if t > 0.0 else prefill[i]
                                           for i, (pp, t) in enumerate(zip(pull_prefill_s, transfer_s))])
        changes["transfer_s"] = tuple([t * f[2 * n + i] for i, t in enumerate(transfer_s)])
        changes["prefill_s"] = prefill
