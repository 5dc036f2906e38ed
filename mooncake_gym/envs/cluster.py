"""What the v1 environments share: the cluster, its workload, the observation and the episode loop.

``mooncake_gym/PrefillRouting-v1``, ``OverloadAdmission-v1`` and ``Conductor-v1`` are one
:class:`mooncake_gym.sim.cluster.ClusterSimulator` each; they differ only in which of its three
decisions the action sets (the others take the simulator's defaults) and in the reward.
:class:`ClusterEnv` holds everything else; :data:`OBSERVATION_DOC` etc. are the parts of their
documentation pages that are the same for all three.

Two engines run the episodes (``engine=``, docs/engine.md "The v1 environments on the engine"): on
a cluster the native engine runs (``mooncake_gym._engine.cluster.preset_unsupported`` is None)
each step is one call into its env core (``ClusterEnvCore``, ``_engine/clusterenv.hpp``) over
:class:`mooncake_gym._engine.cluster.NativeClusterSimulator`, which writes the observation, the
action mask and the info row into buffers the env owns and returns the reward; elsewhere
:class:`_Simulator`, the reference, runs them in Python. Both give the same numbers, bit for bit.
"""

from __future__ import annotations

import functools
import math
import weakref

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from mooncake_gym import _engine
from mooncake_gym._engine.cluster import NativeClusterSimulator, preset_unsupported
from mooncake_gym.sim.observation import as_observation
from mooncake_gym.sim.cluster import ClusterAction, ClusterSimulator, saturation
from mooncake_gym.sim.decode import TBT_TAIL_SHARE, tail_means
from mooncake_gym.sim.admission import DEMO3_BASE_RATE
from mooncake_gym.model.prediction import DEFAULT_PREDICTION_SIGMA, check_sigma, predict_output_tokens
from mooncake_gym.model.presets import ClusterPreset, get_preset
from mooncake_gym.model.workload import synthetic_trace
from mooncake_gym.envs.common import (FeedbackChannel, ValueOrRange, as_float32, as_trace, check_range,
                                      check_workload_shape, clipped, episode_workload, native_or_python)
from mooncake_gym.envs.features import (DEFAULT_WASTE_PENALTY, IN_PREFILL_CAP_PER_INSTANCE, OUTPUT_TOKENS_CAP,
                                        PER_INSTANCE_FEATURES, QUEUE_CAP_SLO, TIME_UNIT_S, TTFT_CAP_SLO, routing_features)

#: Caps of the normalised decode and request features: a value at or above the cap reads 1.
BATCH_CAP = 256  # requests in one decode instance's batch
STEP_CAP_SLO = 2.0  # iteration times, in multiples of the TBT SLO
DECODE_FEATURES = 4
REQUEST_FEATURES = 3  # after v0's two request features

#: The native engine's info row of a step (``ClusterEnvCore``, ``_engine/clusterenv.hpp``; the vector
#: env's interface, envs/vector.py): ClusterEnv.step's info fields and types, in this order; ``ttft_s``
#: is NaN in the row and left out of the info when the request was rejected.
NATIVE_INFO = (("index", int), ("admitted", bool), ("prefill_instance", int), ("good_tokens", int),
               ("good_requests", int), ("wasted_s", float), ("completed", int), ("rejected_at_arrival", int),
               ("rejected_after_prefill", int), ("preempted", int), ("ttft_s", float))
NATIVE_INFO_FIELDS = len(NATIVE_INFO)
#: The policy name of the final step's ``info["metrics"]`` (``ClusterResult``'s first entry).
END_POLICY = "env"


class EpisodeMetrics(dict):
    """A native episode's ``info["metrics"]``: the simulator's final metrics (``sim.result("env")
    .metrics``), made when first read rather than at the episode's last step (the final TBTs and
    metrics cost about as much as 500 engine steps, and a training loop rarely reads them). It is
    a ``dict``; every read (``[k]``, ``in``, ``len``, iteration, ``items()``, ``==``, ``repr``,
    ``copy``, pickling, ...) makes the entries first, from the finished episode's simulator, which
    nothing changes after its last step (the env's next ``reset`` makes a new one; ``restore`` on
    the finished episode makes them first). Unread, it keeps that simulator (about 1.4 MB) alive:
    the env makes the metrics of an episode still held unread when the next episode ends, so at
    most one finished episode's simulator is kept for them. Until read it holds the first entry
    (``policy``), so that C code which reads a subclass's entries through ``items()`` unless the
    dict is empty (``json``'s encoder) reads them all; C code that reads a dict's slots directly
    (``PyDict_Next``) sees only that entry until the metrics are read once (:meth:`fill`)."""

    __slots__ = ("_sim", "__weakref__")

    def __init__(self, sim):
        super().__init__(policy=END_POLICY)
        self._sim = sim

    def fill(self) -> "EpisodeMetrics":
        """Make the entries now (once)."""
        sim = self._sim
        if sim is not None:
            self._sim = None
            dict.update(self, sim.result(END_POLICY).metrics)
        return self

    def __reduce__(self):  # pickles and copies as the plain dict
        return dict, (dict(self.fill()),)


def _filled(name: str):
    method = getattr(dict, name)

    @functools.wraps(method)
    def filled(self, *args, **kwargs):
        if self._sim is not None:
            self.fill()
        return method(self, *args, **kwargs)
    return filled


for _name in ("__getitem__", "__iter__", "__len__", "__contains__", "__eq__", "__ne__", "__repr__", "__or__",
              "__ror__", "__ior__", "__reversed__", "__setitem__", "__delitem__", "keys", "values", "items", "get",
              "copy", "pop", "popitem", "setdefault", "update", "clear"):
    setattr(EpisodeMetrics, _name, _filled(_name))


@functools.cache
def default_base_trace():
    """The base request mix when none is given: the synthetic trace of seed 0 at 4 sessions/s (one
    object, so :func:`mooncake_gym.sim.cluster.saturation`'s cache measures it once per preset)."""
    return synthetic_trace(0, DEMO3_BASE_RATE)


class _Simulator(ClusterSimulator):
    """The cluster simulator plus the running sums the goodput reward needs (the simulator itself is
    unchanged): ``good_tokens`` and ``good_requests``, the output tokens and the number of the
    requests completed within both SLOs that started decoding by the horizon (the last arrival),
    i.e. ``token_goodput`` and ``good_requests`` of the simulator's metrics, counted as the
    requests complete (:meth:`score`)."""

    def reset(self):
        self.good_tokens = self.good_requests = 0
        self._unscored: list[int] = []
        self._rows_seen: dict[int, int] = {}
        return super().reset()

    def _ended(self, completions) -> None:
        super()._ended(completions)
        self._unscored += [c.r for c in completions if not c.preempted]

    def score(self) -> None:
        """Add the requests completed since the last call to the sums. A request's TBT is decided
        against the SLO by ``BatchingDecodeInstance.tbt_within`` (plain Python); only a TBT within
        rounding distance of the SLO is computed exactly here (the simulator computes every TBT in
        one pass at the end, ``finish_tbt``, with the same values)."""
        if not self._unscored:
            return
        p, horizon = self.preset, self._horizon
        ttft_slo, tbt_slo = p.ttft_slo_s, p.tbt_slo_s
        ttft, tbt, start, output = self.ttft_s, self.tbt_s, self.decode_start_s, self._output
        rows = None
        for r in self._unscored:
            if not (ttft[r] <= ttft_slo and start[r] <= horizon):
                continue
            t = tbt[r]
            if t == t:  # known at once (reserve model, or nothing to decode)
                good = t <= tbt_slo
            else:
                if rows is None:
                    rows = self._new_rows()
                inst, row = rows[r]
                good = inst.tbt_within(row, tbt_slo)
                if good is None:  # at the SLO within rounding: the exact value
                    _, offsets, intervals = inst.token_intervals([row])
                    good = bool(tail_means(offsets, intervals)[0][0] <= tbt_slo)
            if good:
                self.good_tokens += output[r]
                self.good_requests += 1
        self._unscored = []

    def _new_rows(self) -> dict:
        """``{request: (decode instance, its row of finished)}`` of the rows added since the last call."""
        rows = {}
        seen = self._rows_seen
        for inst in self.decode:
            finished = getattr(inst, "finished", None)
            if finished:
                k = seen.get(inst.index, 0)
                for row in finished[k:]:
                    rows[row[0]] = (inst, row)
                seen[inst.index] = len(finished)
        return rows


def observation_size(preset: ClusterPreset, oracle: bool, prediction: bool = False) -> int:
    return (PER_INSTANCE_FEATURES * preset.n_prefill + 2 + DECODE_FEATURES * preset.n_decode + REQUEST_FEATURES
            + (1 if oracle else 0) + (1 if prediction else 0))


OBSERVATION_DOC = """\
    ``Box(0, 1, (5 P + 2 + 4 D + 3,), float32)`` (one more with ``oracle=True``, one more with
    ``prediction=True``), P = the preset's
    prefill instances, D = its decode instances (``mooncake``: 8 + 8, 77 features;
    ``mooncake-overload``: 16 + 1, 89). The same observation in the three v1 environments: what
    Mooncake's Conductor sees of both pools at an arrival. Every feature is clipped to [0, 1]: a value
    at or above its cap reads 1. SLO = the preset's TTFT SLO (30 s), TBT SLO its TBT SLO (0.1 s).
    Times of the prefill side are log-scaled as in ``PrefillRouting-v0``:
    ``T(s) = min(1, log1p(s / 0.1) / log1p(10 SLO / 0.1))``.

    | index | feature | unit, scaling | range |
    |---|---|---|---|
    | 5i | queued prefill work on prefill instance i | T(s) | [0, 1] |
    | 5i+1 | requests on i not finished (queued or in service) | count / 50 | [0, 1] |
    | 5i+2 | local prefix hit on i | hit tokens / input tokens | [0, 1] |
    | 5i+3 | estimated TTFT on i without pull | T(s) | [0, 1] |
    | 5i+4 | estimated TTFT on i after pulling the best prefix | T(s) | [0, 1] |
    | 5P | request length | log1p(input tokens) / log1p(200,000) | [0, 1] |
    | 5P+1 | longest prefix cached anywhere | hit tokens / input tokens | [0, 1] |
    | 5P+2+4j | requests in decode instance j's batch | count / 256 | [0, 1] |
    | 5P+3+4j | KV used on j | tokens / the instance's KV capacity | [0, 1] |
    | 5P+4+4j | j's current iteration time (its TBT now; 0 when idle) | s / (2 TBT SLO) | [0, 1] |
    | 5P+5+4j | j's predicted iteration time with this request added | s / (2 TBT SLO) | [0, 1] |
    | 5P+2+4D | predicted TTFT on the default route (Algorithm 1's ``kvcentric``; exact) | s / (1.5 SLO) | [0, 1] |
    | 5P+3+4D | Algorithm 1's TTFT check: 1 if that TTFT exceeds the SLO, else 0 | 0 or 1 | {0, 1} |
    | 5P+4+4D | requests in prefill (queued or running) | count / (20 P) | [0, 1] |
    | 5P+5+4D | (``oracle=True`` only) this request's output length | tokens / 4096 | [0, 1] |
    | last | (``prediction=True`` only) this request's predicted output length | log1p(tokens) / log1p(4096) | [0, 1] |

    The prefill features (indices below 5P+2) are ``PrefillRouting-v0``'s, from the same code. The
    decode features are what a real router reads from the decode instances' load reports; the output
    length is hidden unless ``oracle=True`` (a server does not know it at arrival; the oracle is for
    bounds and references, not for agents). ``prediction=True`` adds what production systems
    approximate with a proxy model run on the prompt (``mooncake_gym.model.prediction``): the true length
    times ``exp(prediction_sigma x z)``, z standard normal per request (log-normal multiplicative
    error, default sigma 0.5; sigma 0 is exact), drawn at ``reset`` for the whole episode from a
    generator seeded from the env's ``np_random`` (so from the episode's seed), whatever the actions.
    After the last request the observation is all zeros."""

WORKLOAD_DOC = """\
    Empty pools and caches. The episode's workload is drawn at ``reset`` from the env's
    ``np_random``: ``episode_requests`` requests drawn i.i.d. from the base trace with Poisson
    arrivals at ``load`` x the cluster's measured saturation throughput
    (``mooncake_gym.sim.cluster.saturation``: the smaller of the prefill pool's and the decode pool's
    requests/s on the base trace's mix), or at a load drawn uniformly from ``load_range``: the
    workload of ``cluster.overload_workload``. The base trace is ``base_trace`` (a path or Trace)
    or the synthetic trace of seed 0 at 4 sessions/s. A request drawn twice repeats its prompt's
    blocks, so long episodes hit the prefix caches more than the base trace does;
    ``fresh_blocks=True`` gives each re-drawn copy new ids for the blocks it brought into the base
    trace (``mooncake_gym.model.workload.resample_iid``; default False). ``trace=`` (or
    ``reset(options={"trace": ...})``) replays a given trace whole at ``speed`` instead. The default
    router's tie-breaks are seeded from ``np_random`` too (``info["sim_seed"]``)."""

END_DOC = """\
    ``terminated`` after the decision on the last request; ``truncated`` only from a
    ``max_episode_steps`` given to ``gym.make``. The *horizon* is the last arrival. After it the
    simulator drains the remaining prefills and decodes, but the drain earns nothing: only requests
    that **started decoding by the horizon** count (their decode slot was won while requests were
    still arriving; the drain's emptying decode pool would otherwise pay a policy for queueing more
    prefill than it can serve, see ``mooncake_gym.sim.cluster``). Such a request counts whole, even
    if it finishes after the horizon; its tokens are in the final step's reward if it does.

    The final step's ``info["metrics"]`` holds the cluster simulator's metrics: exactly what
    ``mooncake_gym.sim.cluster.simulate`` returns for the same trace, seed and decisions. The primary
    ones: ``token_goodput`` (output tokens of the requests that met the TTFT and the TBT SLO and
    started decoding by the horizon) and ``good_requests`` (those requests),
    ``wasted_prefill_gpu_s`` (prefill seconds x GPUs of the prefill instance, of the requests
    rejected after prefill or preempted; the same unit as decode GPU time) and ``accepted_short``,
    ``accepted_medium``, ``accepted_long`` (the share of each output-length class's requests counted
    in ``good_requests``; classes: 1-100, 101-400, over 400 output tokens,
    ``metrics.LENGTH_CLASSES``), so that a policy gaining by refusing long requests shows it.
    Beside them: ``drain_good_requests`` and ``drain_token_goodput`` (the same of the drain, left
    out; the old keys of docs/metrics.md are kept as aliases), TTFT and TBT percentiles and
    attainment, rejections, preemptions, wasted prefill seconds, hit ratio, load correlation. On the
    native engine ``info["metrics"]`` is a ``dict`` whose entries are made when it is first read
    (``envs.cluster.EpisodeMetrics``: the final TBTs and metrics cost about as much as 500 steps);
    the values are the same."""

INFO_DOC = """\
    ``reset`` returns ``{"requests", "load", "saturation_per_s", "sim_seed"}`` (``load`` is NaN
    when a trace is replayed). Each ``step`` returns ``index`` (the decided request's position in
    the trace), ``admitted``, ``ttft_s`` (its TTFT; only if admitted), ``prefill_instance`` (-1 if
    rejected), ``good_tokens`` and ``good_requests`` (output tokens and number of the requests
    completed since the decision that count in ``token_goodput``: both SLOs met, decode started by
    the horizon), ``wasted_s`` (prefill seconds wasted since the decision: rejected after prefill or
    preempted) and the running counts ``completed``, ``rejected_at_arrival``,
    ``rejected_after_prefill`` and ``preempted``; the final step adds ``metrics``."""

ARGUMENTS_DOC = """\
    ``preset`` is any name of ``mooncake_gym.model.presets.PRESETS`` (``lecture``, ``mooncake``,
    ``mooncake-overload``, ``mooncake-overload-tight``, ``mooncake-hetero``, ``h100``) or a ``ClusterPreset``. ``load``
    (finite, > 0) is the arrival rate as a multiple of the saturation throughput; ``load_range`` a pair ``(low, high)``, finite,
    ``0 < low <= high``, not with ``load``. ``prediction`` (bool) adds the predicted output length to
    the observation and the view (``view.predicted_output_tokens``); ``prediction_sigma`` (0 to 3)
    is its log-normal error. ``observation`` is what the policy sees of the prefill pool: a mode
    string or ``mooncake_gym.sim.observation.ObservationConfig`` (``exact``, the default; ``scraped``,
    ``approximate``, ``precise``, ``noisy``, ``mooncake_gym.sim.observation`` and ``docs/envs/prefill_routing.md``); the prefill features, the
    default router and the predicted TTFT come from that view, service stays exact. ``fresh_blocks``
    (bool) gives re-drawn requests new ids for the blocks they brought (Starting State). ``render_mode`` must be None (no picture yet).
    ``engine`` (``"native"``, ``"python"`` or None) chooses the simulator, as ``PrefillRouting-v0``'s
    does (``docs/engine.md``): None (the default) runs the episodes on the native engine where it is
    built, runs the preset's cluster (``mooncake_gym._engine.cluster.preset_unsupported``: every
    shipped preset; not the KV store's SSD tier or global store) and the observation is exact, and
    on the Python reference otherwise; both give the same observations, rewards, infos and metrics, bit for bit.
    ``"native"`` where the engine cannot run the environment raises ``ValueError`` saying why. An
    invalid argument raises ``ValueError`` naming it and its allowed range."""

WORKLOAD_ARGUMENTS_DOC = """\
    Two arguments shape the workload, as ``PrefillRouting-v0``'s do (the same code,
    ``mooncake_gym.model.workload``); both are checked at ``gym.make`` (``ValueError`` naming them).
    ``arrivals`` (not with ``trace``): None for the Poisson arrivals above, or a dict of the fields of
    ``BurstyArrivals`` (``burst_ratio``, ``calm_s``, ``burst_s``: a two-state Markov-modulated Poisson
    process, bursts ``burst_ratio`` times the calm rate) or of ``DiurnalArrivals`` (``amplitude``,
    ``period_s``: a rate ``1 - amplitude x cos(2 pi t / period_s)`` times the mean), or one of those
    objects. The mean rate stays ``load`` x the saturation throughput; the drawn requests are the
    same as with Poisson arrivals, only their arrival times move (the bursty process's path is drawn
    from a generator spawned from ``np_random``). Here the process shapes the requests' arrivals
    (the i.i.d. draws have no sessions), where ``PrefillRouting-v0``'s shapes its sessions' starts.
    ``window_requests`` (an integer, only with ``trace``): each episode replays that many consecutive
    requests of the trace from an offset drawn uniformly from ``np_random`` (or given as
    ``reset(options={"offset": k})``, then accepted as a reset option), their arrivals shifted to
    start at 0 and then replayed at ``speed``; a trace no longer than the window is replayed whole.
    The three v1 environments take both, from this code (``ClusterEnv``)."""

SPEED_DOC = """\
    ``benchmarks/bench_envs.py`` (``mooncake-gym bench --only envs``) measures raw ``step``
    throughput next to Gymnasium's CartPole-v1 in the same run, and next to the environment's
    cluster simulator stepped alone through the same episodes with the same decisions. On the
    native engine, which runs every shipped preset (docs/engine.md), the v1 environments made
    0.71-0.93x CartPole's steps per second through ``gym.make`` with resets on their default presets
    (0.81-1.03x step only; two runs, 2026-12-04, ``bench_envs.py --wrapped --seconds 2``, load average
    7-9), against 0.056-0.08x on the reference. Issue 25's aim of 1.5x is not met: in CPU time a
    1,000-request episode of PrefillRouting-v1 spends about 2.6 ms in the engine's steps, 0.5 ms in
    the Python around them, 0.7 ms in ``reset`` (drawing the workload, building the native simulator)
    and 1.5 ms on its final TBTs and metrics (docs/engine.md has the breakdown)."""

GOODPUT_REWARD_DOC = """\
    The reward of a step is for the decision and for what happened between it and the next
    arrival: the output tokens of every request that completed in that time within both SLOs (TTFT
    and TBT) and had started decoding by the horizon (the last arrival; see Episode End), in units
    of the base trace's mean output length (an average request completing in time earns about 1),
    minus ``waste_penalty`` (default 0.1) x the prefill seconds wasted in that time (requests
    rejected after prefill by their decode instance, and requests preempted from decode), in units
    of ``mean_prefill_s`` (the mean prefill time, without cache hits, of the base trace's requests
    on the preset's prefill instance). A rejection costs 0. A request's TBT is known when it
    completes, so the reward pays it then. The return is therefore exactly
    ``token_goodput / mean output - waste_penalty x wasted_prefill_s / mean_prefill_s`` of the final
    ``info["metrics"]``: the reward is the primary metric, less the waste penalty."""


def shared_sections(rewards: str) -> str:
    """The sections of the v1 environments' pages from Observation Space to Episode End, which they
    share but for ``rewards``, the text of their Rewards section."""
    return "\n\n".join(("    ## Observation Space", OBSERVATION_DOC, "    ## Rewards", rewards, "    ## Info", INFO_DOC,
                        "    ## Starting State", WORKLOAD_DOC, "    ## Episode End", END_DOC))


class ClusterEnv(FeedbackChannel, gym.Env):
    """The base of the v1 environments (see the module docstring); not registered itself.

    Subclasses set ``action_space`` and :attr:`KIND` (the native core's problem: ``"routing"``,
    ``"admission"`` or ``"conductor"``), and implement :meth:`_n_mask` (the length of the native
    core's action mask), :meth:`_action` (the env action to a :class:`ClusterAction`, ``ValueError``
    outside the space), :meth:`_step_core` (the same action on the native core) and :meth:`_reward`."""

    metadata = {"render_modes": [], "render_fps": 4}
    NATIVE_INFO = NATIVE_INFO
    KIND = "routing"

    def __init__(self, preset="mooncake", load=None, load_range=None, default_load: float = 1.0, base_trace=None,
                 trace=None, speed: float = 1.0, episode_requests: int = 1000, oracle: bool = False,
                 waste_penalty: float = DEFAULT_WASTE_PENALTY, render_mode=None, prediction: bool = False,
                 prediction_sigma: float = DEFAULT_PREDICTION_SIGMA, observation=None, fresh_blocks: bool = False,
                 engine=None, arrivals=None, window_requests=None):
        self.preset = get_preset(preset)
        try:
            self.observation = as_observation(observation)
        except ValueError as e:  # name the argument as the user wrote it
            raise ValueError(str(e) if str(e).startswith("observation") else f"observation: {e}") from None
        self.load = ValueOrRange("load", load, load_range, default_load)
        check_range("episode_requests", episode_requests, 1, None, integer=True)
        check_range("speed", speed, 1e-6)
        check_range("waste_penalty", waste_penalty, 0.0)
        for name, flag in (("oracle", oracle), ("prediction", prediction), ("fresh_blocks", fresh_blocks)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: expected True or False, got {flag!r}")
        self.prediction = prediction
        self.fresh_blocks = fresh_blocks
        self.prediction_sigma = check_sigma(prediction_sigma)
        if render_mode is not None:
            raise ValueError(f"render_mode: expected None (the v1 environments do not render), got {render_mode!r}")
        self.render_mode = None
        self.base = as_trace("base_trace", base_trace) if base_trace is not None else default_base_trace()
        self.trace = as_trace("trace", trace) if trace is not None else None
        self.arrivals, self.window_requests = check_workload_shape(arrivals, window_requests, self.trace)
        self.speed = float(speed)
        self.episode_requests = int(episode_requests)
        self.oracle = oracle
        self.waste_penalty = float(waste_penalty)
        p = self.preset
        self.saturation = saturation(self.base, p)
        self.mean_output_tokens = float(self.base.output_tokens.mean())
        self.mean_prefill_s = float(np.mean([p.prefill_cost.prefill_s(n, 0) for n in self.base.input_tokens.tolist()]))
        self.observation_space = spaces.Box(0.0, 1.0, (observation_size(p, oracle, prediction),), np.float32)
        self._time_scale = 1.0 / math.log1p(QUEUE_CAP_SLO * p.ttft_slo_s / TIME_UNIT_S)
        self._step_den = STEP_CAP_SLO * p.tbt_slo_s
        self._ttft_den = TTFT_CAP_SLO * p.ttft_slo_s
        self._in_prefill_den = IN_PREFILL_CAP_PER_INSTANCE * p.n_prefill
        self._log_output_scale = 1.0 / math.log1p(OUTPUT_TOKENS_CAP)
        self.sim: _Simulator | NativeClusterSimulator | None = None
        self.engine = self._choose_engine(engine)
        # what the native core computes with (its episode's horizon is added at reset)
        self._spec = {"kind": self.KIND, "time_scale": self._time_scale, "batch_cap": float(BATCH_CAP),
                      "step_den": self._step_den, "ttft_den": self._ttft_den,
                      "in_prefill_den": float(self._in_prefill_den), "output_cap": float(OUTPUT_TOKENS_CAP),
                      "log_output_scale": self._log_output_scale, "ttft_slo_s": float(p.ttft_slo_s),
                      "tbt_slo_s": float(p.tbt_slo_s), "capacity_tokens": float(p.decode_capacity_per_instance),
                      "reserve_tbt_s": float(p.tbt_s), "tail_share": float(TBT_TAIL_SHARE), "oracle": oracle,
                      "prediction": prediction, "mean_output_tokens": self.mean_output_tokens,
                      "mean_prefill_s": self.mean_prefill_s, "waste_penalty": self.waste_penalty}
        # the buffers the native core writes (a vector env could hand each env rows of its own: _use_buffers)
        self._use_buffers(np.zeros(self.observation_space.shape, np.float32), np.ones(self._n_mask(), np.int8),
                          np.zeros(NATIVE_INFO_FIELDS, np.float64))
        self._core = None  # the native core of the episode, else None
        self._end_metrics = None  # a weak reference to the last native episode's EpisodeMetrics
        self._episode = None  # what reset drew: (trace, the simulator's seed, predicted output lengths)
        self._actions: list = []

    def _n_mask(self) -> int:
        """The action mask's length (the native core's mask buffer): one per action (routing's
        ``2 P`` here; the other two override it)."""
        return 2 * self.preset.n_prefill

    def _choose_engine(self, engine) -> str:
        """The engine of the episodes: ``engine=`` resolved (docs/engine.md); the default falls back
        to the reference where the native engine cannot run this cluster or observation."""
        chosen = _engine.resolve(engine)
        if chosen != "native":
            return chosen
        if not self.observation.exact:
            why = "the native engine shows the exact observation only (observation modes run in Python)"
        else:
            why = preset_unsupported(self.preset)
        return native_or_python(engine, why)

    def _use_buffers(self, obs: np.ndarray, mask: np.ndarray, info: np.ndarray) -> None:
        """Where the native core writes this env's observation, action mask and info row (float32 of
        the observation's size, int8 of the mask's, float64 of NATIVE_INFO_FIELDS)."""
        self._obs, self._mask_buffer, self._info_row = obs, mask, info
        core = getattr(self, "_core", None)
        if core is not None:
            core.bind(obs, mask, info)

    def _end_info(self) -> dict:
        """What the last step's info adds when the episode ends (the vector env's interface): on the
        engine the metrics made when first read (:class:`EpisodeMetrics`)."""
        if self._core is None:
            return {"metrics": self.sim.result(END_POLICY).metrics}
        self._fill_end_metrics()  # an earlier episode's, still held unread: made now, its simulator freed
        metrics = EpisodeMetrics(self.sim)
        self._end_metrics = weakref.ref(metrics)
        return {"metrics": metrics}

    def _fill_end_metrics(self) -> None:
        """Make the last native episode's ``info["metrics"]`` now if something still holds it unread."""
        ref, self._end_metrics = self._end_metrics, None
        metrics = None if ref is None else ref()
        if metrics is not None:
            metrics.fill()

    # -- the decision view --------------------------------------------------------------------------
    def decision_view(self):
        """The simulator's :class:`ClusterView` of the pending request (what baselines read)."""
        return None if self.sim is None else self.sim.view

    def _observe(self) -> np.ndarray:
        if self._core is not None:
            return self._obs.copy()
        v = self.sim.view
        if v is None:
            return np.zeros(self.observation_space.shape, np.float32)
        # the view's decode_batch, decode_used_per_instance, decode_step_s and decode_step_with_s,
        # read from the instances directly: the view computes them together with its mean decode
        # time, which costs a third more and is not observed (tests/test_envs_v1.py checks they agree)
        cap, step_den, now, tokens = v.decode_capacity_per_instance, self._step_den, v.now, v.input_tokens
        rest = []
        for d in self.sim.decode:
            batch, used, step, step_with = d.load(now, tokens)
            rest += (batch / BATCH_CAP, used / cap, step / step_den, step_with / step_den)
        ttft = v.predicted_ttft_s
        rest += (ttft / self._ttft_den, 1.0 if ttft > v.ttft_slo_s else 0.0, v.requests_in_prefill / self._in_prefill_den)
        if self.oracle:
            rest.append(v.output_tokens / OUTPUT_TOKENS_CAP)
        if self.prediction:
            rest.append(math.log1p(v.predicted_output_tokens) * self._log_output_scale)
        # the prefill features are PrefillRouting-v0's observation, in [0, 1] by construction: only the
        # rest is clipped
        return as_float32(routing_features(v.routing, self._time_scale) + clipped(rest))

    # -- Gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        trace, load = episode_workload(self.np_random, options, self.trace, self.speed, self.base,
                                       self.episode_requests, self.load, self.saturation.cluster_per_s,
                                       fresh_blocks=self.fresh_blocks, arrivals=self.arrivals,
                                       window_requests=self.window_requests)
        sim_seed = int(self.np_random.integers(2**31))
        predicted = None
        if self.prediction:  # drawn after everything else, so the workload is the same with or without
            rng = np.random.default_rng(int(self.np_random.integers(2**31)))
            predicted = predict_output_tokens(trace.output_tokens, self.prediction_sigma, rng)
        self._episode = (trace, sim_seed, predicted)
        self._start(self.engine == "native")
        if self.sim.done:
            raise ValueError("trace: every request is too long for one decode instance; nothing to decide")
        return self._observe(), {"requests": len(trace), "load": load,
                                 "saturation_per_s": self.saturation.cluster_per_s, "sim_seed": sim_seed}

    def _start(self, native: bool) -> None:
        """Begin the episode drawn at reset (:attr:`_episode`) at its first arrival: on the native core
        where ``native`` and the trace fits the engine, else on the reference."""
        trace, sim_seed, predicted = self._episode
        self._core = None
        self._actions: list = []  # the native episode's actions, replayed when the env is unpickled
        sim = None
        if native:  # the reference where this trace cannot run natively (its caches' size)
            sim = NativeClusterSimulator(trace, self.preset, oracle=self.oracle, seed=sim_seed,
                                         predicted_output=predicted, observation=self.observation)
            if type(sim) is not NativeClusterSimulator:
                sim = None
        if sim is None:
            sim = _Simulator(trace, self.preset, oracle=self.oracle, seed=sim_seed, predicted_output=predicted,
                             observation=self.observation)
        self.sim = sim
        self._good, self._good_n, self._wasted = 0, 0, 0.0
        if isinstance(sim, NativeClusterSimulator):
            self._core = core = _engine.native.ClusterEnvCore(sim._cluster, {**self._spec, "horizon": sim._horizon},
                                                              sim.predicted_output or [])
            core.bind(self._obs, self._mask_buffer, self._info_row)

    def _engine_steps(self) -> int | None:  # FeedbackChannel's
        return None if self._core is None else len(self._actions)

    def _to_reference(self) -> None:  # FeedbackChannel's: the same episode, restarted on the reference
        self._start(native=False)

    def __getstate__(self) -> dict:
        """A native episode pickles as what reset drew and the actions taken since (the engine's state
        is not picklable); unpickling replays them on a new core, which gives the same state."""
        state = self.__dict__.copy()
        state["_end_metrics"] = None
        if state.get("_core") is not None:
            state["_core"] = state["sim"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.sim is None and getattr(self, "_episode", None) is not None and self._core is None:
            actions = self._actions
            self._start(native=True)
            for a in actions:
                self._actions.append(a)
                self._step_core(self._core, a)

    def step(self, action):
        sim = self.sim
        if sim is None:
            raise RuntimeError("step: call reset() first")
        core = self._core
        if core is not None:  # the engine applies the action, writes the observation and makes the reward and info
            try:
                reward, terminated, info = self._step_core(core, action)
            except IndexError:  # the core's "trace is exhausted"
                raise RuntimeError("step: the episode has terminated; call reset()") from None
            self._actions.append(action)
            sim._view = sim._cached = None  # the simulator's Python caches of the last decision
            if terminated:
                info.update(self._end_info())
            return self._obs.copy(), reward, terminated, False, info
        act = self._action(action)
        if sim.done:
            raise RuntimeError("step: the episode has terminated; call reset()")
        i = sim.view.index
        sim.step(act)
        sim.score()
        good, good_n = sim.good_tokens - self._good, sim.good_requests - self._good_n
        wasted = sim.wasted_prefill_s - self._wasted
        self._good, self._good_n, self._wasted = sim.good_tokens, sim.good_requests, sim.wasted_prefill_s
        terminated = sim.done
        info = {"index": i, "admitted": act.admit, "prefill_instance": sim.prefill_instance[i], "good_tokens": good,
                "good_requests": good_n, "wasted_s": wasted, "completed": sim.completed,
                "rejected_at_arrival": sim.rejected_at_arrival, "rejected_after_prefill": sim.rejected_after_prefill,
                "preempted": sim.preempted}
        if act.admit:
            info["ttft_s"] = sim.ttft_s[i]
        if terminated:
            info["metrics"] = sim.result(END_POLICY).metrics
        return self._observe(), float(self._reward(info)), terminated, False, info

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self):
        """An opaque copy of the episode's state (the simulator's, on either engine, and the reward's
        running sums), for :meth:`restore`: valid for many restores, in any order, during this episode."""
        sim = self.sim
        if sim is None:
            raise RuntimeError("snapshot: call reset() first")
        core = None if self._core is None else _engine.native.env_snapshot(self._core)
        return (sim, sim.snapshot(), core, (self._good, self._good_n, self._wasted))

    def restore(self, snapshot) -> np.ndarray:
        """Back to the state of ``snapshot`` (from :meth:`snapshot` during this episode); returns the
        pending decision's observation. Continuing with the same actions gives the same rewards,
        observations and infos as the run the snapshot was taken in."""
        if not (isinstance(snapshot, tuple) and len(snapshot) == 4 and snapshot[0] is self.sim):
            raise ValueError("snapshot: expected a snapshot of this env's current episode")
        sim, state, core, sums = snapshot
        self._fill_end_metrics()  # (a finished episode's metrics, made before its state changes)
        if core is not None:
            sim.restore_state(state)
            _engine.native.env_restore(self._core, core)  # (writes the observation and the mask)
        else:
            sim.restore(state)
        self._good, self._good_n, self._wasted = sums
        return self._observe()

    def goodput_reward(self, info: dict) -> float:
        """The reward of ``OverloadAdmission-v1`` and ``Conductor-v1`` (:data:`GOODPUT_REWARD_DOC`)."""
        return info["good_tokens"] / self.mean_output_tokens - self.waste_penalty * info["wasted_s"] / self.mean_prefill_s

    def _action(self, action) -> ClusterAction:
        raise NotImplementedError

    def _step_core(self, core, action) -> tuple:
        """``action`` checked (``ValueError`` outside the space, as :meth:`_action`) and taken on the
        native core: its ``(reward, terminated, info)``."""
        raise NotImplementedError

    def _reward(self, info: dict) -> float:
        raise NotImplementedError
