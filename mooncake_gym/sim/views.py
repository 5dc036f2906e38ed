"""The views and actions of the cluster: what a policy sees at a decision and what it answers.

Shared bridge types at the bottom of the core: the simulators build the views and parse the
actions, the policies (``mooncake_gym.baselines``, agents, a student's function) read and return
them, and neither side imports the other.

- :class:`RoutingView` / :class:`Route` (and its one parser :func:`check_route`): the prefill pool's
  decision, which prefill instance serves the request and whether it pulls the best prefix first.
- :class:`AdmissionView` and :func:`check_admit`: the lecture's admission decision (admit or reject
  at arrival), the view of the v0 admission environment.
- :class:`ClusterView` / :class:`ClusterAction`: the three decisions of the cluster's Conductor
  (admission, prefill instance, decode instance).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any, NamedTuple

import numpy as np

from mooncake_gym._moved import renamed
from mooncake_gym._native import mypyc_attr


class Route(NamedTuple):
    """A routing action: the prefill instance, and whether to pull the best prefix there first."""

    instance: int
    pull: bool = False


def check_route(action, n_instances: int) -> tuple[int, bool]:
    """The one check of a routing answer (simulator, ``evaluate`` and the env alike): an instance
    ``0 <= i < n_instances`` (a Python or numpy integer, not a bool) or ``Route(i, pull)`` / a pair
    ``(i, pull)`` with ``pull`` a bool, numpy bool or the integer 0 or 1. Returns ``(i, pull)``;
    ``TypeError`` for a wrong type, ``ValueError`` for a value out of range. Nothing is coerced:
    ``Route(1, 'no')`` is an error, not a pull."""
    inst: Any  # (not typed by the first unpacking: compiled, that would type-check the later ones)
    pull: Any
    if type(action) is Route:  # what the baselines return: checked without conversions
        inst, pull = action
        if type(inst) is int and type(pull) is bool and 0 <= inst < n_instances:
            return action
    if isinstance(action, tuple):  # Route or (instance, pull)
        if len(action) != 2:
            raise ValueError(f"action: expected an instance or (instance, pull), got {action!r}")
        inst, pull = action
        if isinstance(pull, (bool, np.bool_)):
            pull = bool(pull)
        elif isinstance(pull, (int, np.integer)) and (pull == 0 or pull == 1):
            pull = bool(pull == 1)
        else:
            raise TypeError(f"action: pull must be True or False (or 0 or 1), got {type(pull).__name__} {pull!r}")
    else:
        inst, pull = action, False
    if isinstance(inst, (bool, np.bool_)) or not isinstance(inst, (int, np.integer)):
        raise TypeError(f"action: instance must be an integer, got {type(inst).__name__} {inst!r}")
    if not 0 <= inst < n_instances:
        raise ValueError(f"action: instance must be in 0..{n_instances - 1}, got {inst}")
    return int(inst), pull


RoutingViewFields = namedtuple("RoutingViewFields", [  # the fields written out: mypy (and mypyc) read them
    "now", "index", "input_tokens", "output_tokens", "block_ids", "n_instances", "queue_s", "queued_requests",
    "hit_tokens", "prefill_s", "best_hit_tokens", "best_instance", "transfer_s", "pull_prefill_s", "queued_tokens",
    "cache_blocks", "hit_blocks", "hit_tier_tokens"], defaults=(None,))
#: The fields of :class:`RoutingView`, in order.
ROUTING_VIEW_FIELDS: tuple[str, ...] = RoutingViewFields._fields


@mypyc_attr(native_class=False)  # a named tuple
class RoutingView(RoutingViewFields):
    """What a routing policy sees at one arrival (read-only; tuples are indexed by instance).

    A named tuple: a policy cannot change what the simulator recorded (setting a field raises
    ``AttributeError``), and building one is a single tuple allocation on the hot path.

    now: current time (s), the request's arrival.
    index: the request's position in the trace.
    input_tokens, output_tokens, block_ids: the request.
    queue_s: work queued on each instance (s), Algorithm 1's T_queue.
    queued_requests: requests dispatched to each instance and not finished (including the one in service).
    queued_tokens: computed (uncached) prompt tokens of those requests (Dynamo's "active prefill tokens").
    cache_blocks: each instance's prefix-cache capacity in blocks.
    hit_tokens: each instance's local prefix hit for this request (tokens).
    hit_blocks: each instance's local prefix hit in blocks (leading blocks of ``block_ids`` it holds).
    prefill_s: estimated prefill time on each instance given its local hit.
    best_hit_tokens, best_instance: the longest prefix held anywhere and who holds it (-1 if none).
    transfer_s: time to pull the part of the best prefix each instance lacks (0 where none is missing).
    pull_prefill_s: prefill time on each instance after such a pull (with the best hit).
    hit_tier_tokens: where each instance's hit comes from, ``(dram, ssd, remote_dram, remote_ssd)``
        tokens (its own DRAM and SSD tiers, another node's DRAM and SSD over RDMA); None when the
        pool has no SSD tier and a local store (every hit is in the instance's own DRAM:
        :meth:`tier_tokens` says so). ``prefill_s`` counts each tier's load: an SSD hit at the SSD's
        bandwidth, overlapped layer by layer with the compute, a remote one (the global store,
        ``kv_store="global"``) as an RDMA copy before it.

    With the default exact observation every field is the simulator's truth; an observation mode
    (``mooncake_gym.sim.observation``) changes what the load, hit and time fields say, never the class
    or the fields.
    """

    __slots__ = ()

    def ttft_s(self, instance: int, pull: bool = False) -> float:
        """Estimated TTFT on ``instance`` (exact with the exact observation): queue + transfer + prefill."""
        if pull:
            return self.queue_s[instance] + self.transfer_s[instance] + self.pull_prefill_s[instance]
        return self.queue_s[instance] + self.prefill_s[instance]

    def tier_tokens(self, instance: int) -> tuple[int, int, int, int]:
        """``hit_tier_tokens[instance]``: the hit's tokens in (own DRAM, own SSD, remote DRAM, remote SSD)."""
        tiers = self.hit_tier_tokens
        return (self.hit_tokens[instance], 0, 0, 0) if tiers is None else tiers[instance]

    def __repr__(self) -> str:
        return (f"RoutingView(now={self.now:.3f}, index={self.index}, input={self.input_tokens}, "
                f"hits={self.hit_tokens}, queue_s={tuple(round(q, 3) for q in self.queue_s)})")



def check_admit(answer) -> bool:
    """The one check of an admission answer (simulator, ``evaluate`` and the env alike): ``True``
    / ``False`` (or numpy bools) or the integer 1 / 0 (Python or numpy). ``TypeError`` for any other
    type (a string such as ``'reject'``, a float, NaN, None), ``ValueError`` for another integer
    (``-1``). Nothing is coerced with ``bool()``."""
    if answer is True or answer is False:
        return answer
    if isinstance(answer, np.bool_):
        return bool(answer)
    if isinstance(answer, (int, np.integer)):
        if answer == 0 or answer == 1:
            return bool(answer == 1)
        raise ValueError(f"admit: expected True or False (or 1 or 0), got {answer!r}")
    raise TypeError(f"admit: expected True or False (or 1 or 0), got {type(answer).__name__} {answer!r}")


def check_cluster_action(action, n_prefill: int, n_decode: int) -> tuple[bool, Route | None, int | None]:
    """The one check of a cluster action (the simulator and the envs alike): a
    :class:`ClusterAction` or a tuple ``(admit, route, decode)``, or a bare admission answer (admit
    with the default route and decode rule). ``admit`` is checked by :func:`check_admit`, ``route``
    (None: the default router's) by :func:`check_route`, ``decode`` is None (the default rule at the
    prefill's end) or an instance ``0 <= j < n_decode``. Returns ``(admit, route, decode)``;
    ``ValueError`` naming the part (``action.admit``, ``action.route``, ``action.decode``)."""
    if not isinstance(action, tuple):
        action = (action, None, None)
    elif len(action) != 3:
        raise ValueError(f"action: expected a ClusterAction(admit, route, decode) or a bool, got {action!r}")
    admit, route, decode = action
    try:
        admit = check_admit(admit)
    except (TypeError, ValueError) as e:
        raise ValueError(f"action.{e}") from None
    if route is not None:
        try:
            route = Route(*check_route(route, n_prefill))
        except (TypeError, ValueError) as e:
            raise ValueError(f"action.route{str(e)[len('action'):]}") from None
    if decode is not None:
        if isinstance(decode, (bool, np.bool_)) or not isinstance(decode, (int, np.integer)) \
                or not 0 <= decode < n_decode:
            raise ValueError(f"action.decode: expected None or an instance in 0..{n_decode - 1}, got {decode!r}")
        decode = int(decode)
    return admit, route, decode


class _PoolLoads:
    """The two loads of Mooncake §7 at one arrival, shared by the admission and cluster views."""

    __slots__ = ()
    decode_used_tokens: int
    decode_pool_capacity_tokens: int
    predicted_ttft_s: float
    ttft_slo_s: float

    @property
    def decode_load(self) -> float:
        """Decode pool KV occupancy now, used / capacity of the whole pool (``early`` looks at the
        emptiest instance instead: see ``baselines.admission.EarlyRejection``)."""
        return self.decode_used_tokens / self.decode_pool_capacity_tokens

    decode_capacity_tokens = renamed("decode_capacity_tokens", "decode_pool_capacity_tokens")

    @property
    def prefill_load(self) -> float:
        """Prefill load as in Mooncake §7: the predicted TTFT over the TTFT SLO."""
        return self.predicted_ttft_s / self.ttft_slo_s


#: The fields of :class:`AdmissionView`, in order (then the simulator, whose projections the
#: view's methods call).
ADMISSION_VIEW_FIELDS = ("now", "index", "input_tokens", "output_tokens", "decode_used_tokens",
                         "decode_pool_capacity_tokens", "decode_used_per_instance", "decode_capacity_per_instance",
                         "prefill_queue_s", "prefill_instance", "prefill_s", "predicted_prefill_finish",
                         "predicted_ttft_s", "ttft_slo_s", "recent_rejected", "recent_rejected_after_prefill",
                         "recent_wasted_s", "requests_in_prefill", "requests_in_decode", "mean_decode_s",
                         "mean_output_tokens")


class AdmissionView(namedtuple("AdmissionViewFields", ADMISSION_VIEW_FIELDS + ("simulator",)), _PoolLoads):
    """What an admission policy sees at one arrival: read-only, like ``RoutingView``. A named tuple,
    so a policy cannot change what the simulator recorded (setting a field raises
    ``AttributeError``) and building one costs one tuple allocation (a frozen dataclass of this many
    fields costs about 2 us, a tenth of the Gym environment's step).

    Fields:
    - ``now``: the arrival time (s); ``index``: the request's position in the trace.
    - ``input_tokens``; ``output_tokens``: the output length only with ``config.oracle``, else None.
    - ``decode_used_tokens`` / ``decode_pool_capacity_tokens``: the decode pool's used and total KV
      tokens; ``decode_used_per_instance`` and ``decode_capacity_per_instance``: per instance
      (``decode_capacity_tokens``, the old name of the pool's total, warns: a preset's and an
      environment's ``decode_capacity_tokens`` is the setting of the per-instance capacity).
    - ``prefill_queue_s``: queued prefill work (s) per prefill instance; ``prefill_instance``: the
      least loaded one, where this request would go; ``prefill_s``: its prefill time there;
      ``predicted_prefill_finish`` (absolute time) and ``predicted_ttft_s`` (= finish - now, exact).
    - ``ttft_slo_s``: the SLO of the run; ``recent_rejected`` (at arrival or after prefill),
      ``recent_rejected_after_prefill`` and ``recent_wasted_s``: within the last
      ``config.recent_window_s`` seconds.
    - ``requests_in_prefill`` and ``requests_in_decode``: counts.
    - ``mean_decode_s`` and ``mean_output_tokens``: the workload's mean decode time and output
      length (statistics a production system takes from its logs; not this request's).
    - ``simulator``: the cluster simulator whose projections the methods below compute, with
      ``mean_decode_s`` as the default decode time (left out of the repr; a policy reads the view,
      it does not drive the simulator).

    The projection methods look at the requests in prefill and in decode without revealing any
    individual output length (except in oracle mode); the predictive baselines use them.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "AdmissionView(" + ", ".join(f"{k}={v!r}" for k, v in zip(ADMISSION_VIEW_FIELDS, self)) + ")"

    def project_decode(self, at_s: float, decode_s: float | None = None, quantile: float | None = None,
                       output_tokens: float | None = None) -> list:
        """Projected used tokens of each decode instance at time ``at_s`` (this request not included).

        Replays the decode pool forward from now to ``at_s`` under assumed decode times, the way the
        simulator would run it: requests in prefill enter decode at their (known) prefill finish on
        the instance with the most room, if they fit, with ``input + output_tokens`` tokens (default
        the workload's mean output); requests leave at their assumed decode end.

        - Uniform (``quantile=None``, Mooncake v3 §7.4): every request decodes ``decode_s`` seconds
          (default ``mean_decode_s``), counted from its decode start — so a request already decoding
          for longer than that is assumed gone.
        - Distribution (``quantile=q``): a request that has decoded k tokens so far is assumed to end
          at the q-quantile of the workload's output lengths *longer than k* (long-running requests
          of a long-tailed distribution are expected to run on); a request still in prefill decodes
          ``decode_s`` (default the mean: its expected share of decode token-seconds).

        Individual output lengths are never used (in oracle mode too), only the workload's statistics.
        """
        return self.simulator.project_decode(at_s, self.mean_decode_s if decode_s is None else decode_s, quantile,
                                             output_tokens)

    def project_decode_tokens(self, at_s: float, decode_s: float | None = None,
                              output_tokens: float | None = None) -> float:
        """Decode-pool tokens at ``at_s`` by Mooncake v3 §7.4's sum, every request decoding ``decode_s``
        seconds (default ``mean_decode_s``): the requests in decode whose start + ``decode_s`` is
        after ``at_s`` (their reserved tokens), plus the requests in prefill that finish by ``at_s``
        and whose finish + ``decode_s`` is after it (``input + output_tokens`` each, default the mean
        output). No capacity limit is applied (so it can exceed the pool); this request not included.
        """
        return self.simulator.decode_token_projections(at_s, self.mean_decode_s if decode_s is None else decode_s,
                                                       output_tokens)[0]

    def expected_decode_tokens(self, at_s: float, output_tokens: float | None = None) -> float:
        """Expected decode-pool tokens at ``at_s`` under the workload's decode-time distribution: a
        request decoding since d is still there with probability S(at_s - d) / S(now - d) (S the
        survival function of decode times, conditioned on its having run until now); a request in
        prefill finishing at f <= at_s with probability S(at_s - f). No capacity limit applied."""
        return self.simulator.decode_token_projections(at_s, self.mean_decode_s, output_tokens)[1]

    def decode_survival(self, x_s: float) -> float:
        """P(decode time > ``x_s``) over the workload."""
        return self.simulator.decode_survival(x_s)



class ClusterAction(NamedTuple):
    """The three decisions for one arriving request: admit it; the prefill ``route``
    (``Route(instance, pull)``, or None for the default router's); the ``decode`` instance (or None:
    the default rule at the prefill's end)."""

    admit: bool = True
    route: Route | None = None
    decode: int | None = None


class ClusterView(_PoolLoads):
    """What the Conductor sees at one arrival (read-only by convention).

    The request: ``now``, ``index``, ``input_tokens``, ``output_tokens`` (only with ``oracle``,
    else None), ``predicted_output_tokens`` (a predictor's estimate of it, only when the simulator
    was given ``predicted_output``, else None; :mod:`mooncake_gym.model.prediction`). Prefill: ``routing``
    (the prefill pool's :class:`RoutingView`), ``default_route`` (what the default router would
    choose), and, on that route, ``prefill_instance``,
    ``predicted_ttft_s`` and ``predicted_prefill_finish`` (exact: FIFO and deterministic). Decode
    (per instance): ``decode_batch`` (running requests), ``decode_used_per_instance`` (KV tokens
    now), ``decode_capacity_per_instance`` (tokens), ``decode_step_s`` (the time of the iteration
    running now, i.e. the current TBT; 0 when idle), ``decode_step_with_s`` (predicted iteration
    time with this request added). SLOs: ``ttft_slo_s``, ``tbt_slo_s``. Workload statistics a
    deployment keeps: ``mean_output_tokens``, ``mean_decode_s`` (mean output x the mean token
    interval seen so far). Counts: ``requests_in_prefill``, ``requests_in_decode``.

    The field names shared with :class:`AdmissionView` mean the same, so the admission
    baselines run on both.
    """

    __slots__ = ("now", "index", "input_tokens", "output_tokens", "predicted_output_tokens", "routing",
                 "decode_capacity_per_instance", "ttft_slo_s", "tbt_slo_s", "mean_output_tokens", "requests_in_prefill", "requests_in_decode",
                 "_sim", "_decode", "_route")
    # the slots' types (set by ClusterSimulator._make_view)
    now: float
    index: int
    input_tokens: int
    output_tokens: int | None
    predicted_output_tokens: float | None
    routing: RoutingView
    decode_capacity_per_instance: int
    ttft_slo_s: float
    tbt_slo_s: float
    mean_output_tokens: float
    requests_in_prefill: int
    requests_in_decode: int
    _sim: Any  # the ClusterSimulator that made it
    _decode: tuple | None
    _route: tuple | None

    def _default(self) -> tuple:
        """(route, prefill instance, prefill time, predicted prefill finish) of the default router,
        computed on first use."""
        if self._route is None:
            rv = self.routing
            route = self._sim.router(rv)
            if not isinstance(route, tuple):
                route = Route(int(route))
            k = route[0]
            pull = route[1] and rv.best_hit_tokens > rv.hit_tokens[k]
            prefill_s = rv.transfer_s[k] + rv.pull_prefill_s[k] if pull else rv.prefill_s[k]
            self._route = (route, k, prefill_s, self.now + rv.queue_s[k] + prefill_s)
        return self._route

    @property
    def default_route(self) -> Route:
        return self._default()[0]

    @property
    def prefill_instance(self) -> int:
        return self._default()[1]

    @property
    def prefill_s(self) -> float:
        return self._default()[2]

    @property
    def predicted_prefill_finish(self) -> float:
        return self._default()[3]

    @property
    def predicted_ttft_s(self) -> float:
        return self._default()[3] - self.now

    def _decode_side(self) -> tuple:
        if self._decode is None:
            if self._sim.view is not self:
                raise RuntimeError("view: the decode side of a view is readable only until the next step")
            self._decode = self._sim.decode_fields()
        return self._decode

    @property
    def decode_batch(self) -> tuple:
        return self._decode_side()[0]

    @property
    def decode_used_per_instance(self) -> tuple:
        return self._decode_side()[1]

    @property
    def decode_step_s(self) -> tuple:
        return self._decode_side()[2]

    @property
    def decode_step_with_s(self) -> tuple:
        return self._decode_side()[3]

    @property
    def mean_decode_s(self) -> float:
        return self._decode_side()[4]

    @property
    def n_prefill(self) -> int:
        return self.routing.n_instances

    @property
    def n_decode(self) -> int:
        return len(self.decode_batch)

    @property
    def decode_used_tokens(self) -> int:
        return sum(self.decode_used_per_instance)

    @property
    def decode_pool_capacity_tokens(self) -> int:
        return self.decode_capacity_per_instance * len(self.decode_used_per_instance)

    def project_decode(self, at_s: float, decode_s: float | None = None, quantile: float | None = None,
                       output_tokens: float | None = None) -> list:
        """Projected KV tokens of each decode instance at ``at_s`` (this request not included), as
        :meth:`AdmissionView.project_decode`: requests decoding now leave at their assumed end
        (uniform: start + ``decode_s``, default ``mean_decode_s``; ``quantile=q``: after the
        q-quantile of the workload's output lengths longer than what they have produced, at the
        instance's current step time), keeping their current tokens until then; requests in
        prefill join at their known prefill end with ``input + output_tokens`` (default the mean
        output) on the emptiest instance if they fit. Individual output lengths are never used."""
        return self._sim.project_decode(at_s, decode_s, quantile, output_tokens)

    def project_decode_step_s(self, at_s: float, decode_s: float | None = None,
                              output_tokens: float | None = None) -> list | None:
        """Predicted iteration time (the TBT) of each decode instance at ``at_s`` with this request
        on it, on :meth:`project_decode`'s uniform projection (every request decoding ``decode_s``,
        default ``mean_decode_s``): the projected batch + 1 over the projected context + this prompt,
        by the instance's cost model. None for an instance whose KV would not hold it; None in all
        under the ``reserve`` decode model, whose iteration time is fixed (Mooncake v3 §7.4)."""
        return self._sim.project_decode_step_s(at_s, self.input_tokens, decode_s, output_tokens)
