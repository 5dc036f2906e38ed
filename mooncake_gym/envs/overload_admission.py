"""``mooncake_gym/OverloadAdmission-v0``: admission control of a disaggregated cluster under overload."""

from __future__ import annotations

import heapq
import math
import struct

import numpy as np
from gymnasium import spaces

from mooncake_gym import _engine
from mooncake_gym._engine.cluster import NativeClusterSimulator
from mooncake_gym._engine.routing import prefill_disagrees, prefill_fields
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.admission import (DEMO3_BASE_RATE, REJECTED_AFTER_PREFILL, REJECTED_AT_ARRIVAL, LectureAdmission,
                                        OverloadConfig, check_admit, check_load_samples, decode_capacity_rate)
from mooncake_gym.sim.views import AdmissionView
from mooncake_gym.model.workload import Trace, synthetic_trace
from mooncake_gym.envs.common import (INTEGER_TYPES, PicturedEnv, ValueOrRange, as_trace, check,
                                      check_render_mode, episode_workload, in_space, native_or_python)
from mooncake_gym.envs.features import (DEFAULT_WASTE_PENALTY, IN_PREFILL_CAP_PER_INSTANCE, INPUT_TOKENS_CAP,
                                        OUTPUT_TOKENS_CAP, TTFT_CAP_SLO)
from mooncake_gym.envs.viewer import AdmissionViewer

LOG1P_INPUT_TOKENS_CAP = math.log1p(INPUT_TOKENS_CAP)  # request length feature: log1p(tokens) / this
#: Load (arrivals over the decode pool's capacity rate) with neither ``load`` nor ``load_range``: demo 3's.
DEFAULT_LOAD = 2.0
#: The observation's floats as float32 bytes, by its size (a module's: a Struct does not pickle).
_PACK = {n: struct.Struct(f"={n}f").pack for n in (11, 12)}
#: The native core's info row of a step (``AdmissionEnv``, ``_engine/admission.hpp``), in its order.
NATIVE_INFO_FIELDS = 8


class OverloadAdmissionEnv(PicturedEnv):
    """
    ## Description

    A disaggregated cluster (Mooncake, arXiv 2407.00079, §7) of ``n_prefill`` prefill instances and
    ``n_decode`` decode instances holding ``decode_capacity_tokens`` tokens of KV each receives more
    requests than its decode pool can serve. One step is one arriving request, and the agent admits
    or rejects it. An admitted request is prefilled (FIFO, least-loaded prefill instance); when its
    prefill finishes it needs a decode instance with room for input + output tokens for
    output x ``tbt_s`` seconds, and if none has room it is rejected after prefill and its prefill is
    wasted. The simulation is the cluster simulator under the ``lecture`` preset
    (``mooncake_gym.sim.admission.LectureAdmission`` over ``mooncake_gym.sim.cluster.ClusterSimulator``),
    the same object that runs the hand-coded admission baselines; every time comes from
    ``mooncake_gym.model.costmodel``.

    ## Action Space

    ``Discrete(2)``: 0 = reject at arrival, 1 = admit. Both are legal at every step; an action
    outside the space (or not an integer) raises ``ValueError``.

    ## Observation Space

    ``Box(0, 1, (11,), float32)`` (``(12,)`` with ``oracle=True``). Capacity = the decode pool's
    total tokens (``n_decode x decode_capacity_tokens``); per-instance capacity =
    ``decode_capacity_tokens``; SLO = ``ttft_slo_s``; window = the simulator's ``recent_window_s``
    (30 s); decode capacity rate = the requests/s the decode pool completes on the base trace
    (see Starting State). Every feature is clipped to [0, 1]: a value at or above its cap reads 1.
    The workload's statistics (mean output, mean decode time, decode-time distribution) are those
    of the episode's requests, as a deployment takes them from its logs; no feature but 11 reveals a
    request's own output length.

    | index | feature | unit, scaling | range |
    |---|---|---|---|
    | 0 | decode pool occupancy now | used tokens / capacity | [0, 1] |
    | 1 | decode pool tokens projected at this request's prefill finish, every request decoding the mean decode time (Mooncake §7.4; no capacity limit applied) | tokens / capacity | [0, 1] |
    | 2 | expected decode pool tokens at that moment under the decode-time distribution, conditioned on how long each request has decoded | tokens / capacity | [0, 1] |
    | 3 | predicted TTFT (queued prefill work + own prefill; exact in this simulator) | s / (1.5 SLO) | [0, 1] |
    | 4 | room on the decode instance with the most free room | tokens / per-instance capacity | [0, 1] |
    | 5 | this request's expected need, input + mean output tokens | tokens / per-instance capacity | [0, 1] |
    | 6 | request length | log1p(input tokens) / log1p(200,000) | [0, 1] |
    | 7 | recent rejections (at arrival or after prefill) | count / (window x decode capacity rate) | [0, 1] |
    | 8 | recently wasted prefill | s / (window x n_prefill) | [0, 1] |
    | 9 | requests in prefill (queued or running) | count / (20 n_prefill) | [0, 1] |
    | 10 | Algorithm 1's prefill check: 1 if the predicted TTFT exceeds the SLO (admitting it would be doomed), else 0 | 0 or 1 | {0, 1} |
    | 11 | (``oracle=True`` only) this request's output length | tokens / 4096 | [0, 1] |

    The output length is hidden unless ``oracle=True``: real systems do not know it at arrival.
    After the last request the observation is all zeros.

    ## Rewards

    The reward of a step is for the decision and for what happened between it and the next
    arrival: +1 for every admitted request that got a decode slot with TTFT <= ``ttft_slo_s`` (it
    then completes for sure; rewarding at the slot grant rather than at completion shortens the
    credit-assignment delay), minus ``waste_penalty`` x wasted prefill seconds in units of
    ``mean_prefill_s`` (the mean prefill time of the base trace's requests; default penalty 0.1:
    wasting an average prefill costs a tenth of a completion). Wasted prefill is charged as soon as
    it is certain:

    * at the decision, the prefill of a request admitted although its predicted TTFT exceeds the
      SLO (the prediction is exact here, so it can never count as goodput: ``info["doomed_s"]``);
    * when a prefill ends without a decode slot (rejected after prefill: ``info["wasted_s"]``),
      unless that request was charged at its admission already.

    A rejection costs 0. The episode's return is therefore goodput minus ``waste_penalty`` x (the
    simulator's ``wasted_prefill_s`` + the prefill of doomed requests that did get a decode slot) /
    ``mean_prefill_s``. Charging doomed prefill at the decision gives the agent an immediate signal
    for Algorithm 1's prefill check, which the grant alone (paid hundreds of arrivals later, and
    only through the queueing delay it causes others) teaches very slowly. With the default penalty
    the return ranks policies by goodput unless their goodputs are close and their waste differs a
    lot (``tests/test_envs.py`` checks the ranking across the baselines); a larger penalty (0.5 and
    up) rewards saving prefill compute over completing the last few requests.

    ## Info

    ``reset`` returns ``{"requests", "load", "capacity_rate_per_s"}``: the episode's request count,
    its load (NaN when a trace is replayed) and the decode capacity rate (requests/s). Each ``step``
    returns ``index`` (the decided request's position in the trace), ``admitted``, ``granted``
    (requests granted a decode slot within the SLO since the decision, the positive part of the
    reward), ``doomed_s`` (the decided request's prefill seconds if it was admitted beyond the
    SLO, else 0), ``wasted_s`` (prefill seconds wasted after prefill since the decision, not counting
    doomed requests) and the running counts
    ``completed``, ``rejected_at_arrival`` and ``rejected_after_prefill``; the final step adds
    ``metrics``.

    ## Starting State

    Empty pools. The episode's workload is drawn at ``reset`` from the env's ``np_random``:
    ``episode_requests`` requests drawn i.i.d. from the base trace with Poisson arrivals at ``load``
    times the decode pool's capacity rate (or a load drawn uniformly from ``load_range``), as in
    lecture demo 3 (the drawn requests carry no block ids: the cluster caches nothing). The
    capacity rate is ``n_decode x decode_capacity_tokens`` / the base trace's mean (input +
    output) x output x ``tbt_s`` token-seconds. The base trace is ``base_trace`` (a
    path or Trace) or the synthetic trace of seed 0 at 4 sessions/s. ``trace=`` (or
    ``reset(options={"trace": ...})``) replays a given trace whole at ``speed`` instead
    (``episode_requests`` and ``load`` then do not apply; the reward's ``mean_prefill_s`` and
    feature 7's capacity rate are still the base trace's).

    ## Episode End

    ``terminated`` after the decision on the last request (the remaining prefills and decodes are
    then drained and rewarded in that step); ``truncated`` only from a ``max_episode_steps`` given to
    ``gym.make``. The final step's ``info["metrics"]`` holds the admission problem's metrics
    (among them completed, goodput, rejected at arrival and after prefill, wasted prefill seconds,
    mean decode occupancy, load correlation): exactly what ``mooncake_gym.sim.admission.simulate``
    returns for the same trace and decisions.

    ## Arguments

    ``gym.make("mooncake_gym/OverloadAdmission-v0", load=None, load_range=None, base_trace=None,
    trace=None, speed=1.0, episode_requests=2000, n_prefill=8, n_decode=8,
    decode_capacity_tokens=60000, tbt_s=0.05, ttft_slo_s=30.0, oracle=False, waste_penalty=0.1,
    model="llama2-70b", render_mode=None, engine=None)``. With neither ``load`` nor ``load_range`` the load is 2.
    ``load`` (finite, > 0) is the arrival rate as a multiple of the decode capacity rate;
    ``load_range`` a pair ``(low, high)``, finite, ``0 < low <= high``, not with ``load``.
    ``model`` is a preset of ``mooncake_gym.model.costmodel.MODELS``. ``render_mode="ansi"``: ``render()``
    returns a text picture; ``"rgb_array"``: a picture of the two pools (see Rendering). An invalid
    argument raises ``ValueError`` naming it and its allowed range. ``engine`` (``"native"``,
    ``"python"`` or None) chooses the simulator, as ``PrefillRouting-v0``'s does (``docs/engine.md``):
    None (the default) runs the episodes on the native engine where it is built and runs ``model``'s
    prefill times, else on the Python reference; ``"native"`` where it cannot raises ``ValueError``
    saying why. Both give the same observations, rewards and infos, bit for bit.

    ## Rendering

    ``render_mode="rgb_array"``: ``render()`` returns a picture of the two pools, a ``(400, W, 3)``
    uint8 array (W = 640 pixels up to about 100 instances in all, wider beyond; a multiple of 16 for
    video encoders). Left, the prefill pool: per instance a bar of its queued work (the top of the
    scale is the TTFT SLO; a red cap marks more), with the pending request's prefill stacked in a
    lighter blue on the least-loaded instance, where it would go (highlighted). Right, the decode
    pool: per instance its KV occupancy (the top is full), with the time between tokens in the
    title. Below, the whole decode pool's occupancy and the request's predicted TTFT over the SLO;
    at the top, the last decision (green: admitted, red: rejected at arrival) and the running counts
    of completed requests and of rejections at arrival and after prefill. A frame takes about a
    millisecond (``benchmarks/bench_render.py``). Videos: gymnasium's ``RecordVideo`` wrapper, which
    needs moviepy (``pip install "mooncake-gym[video]"``); a video plays at
    ``metadata["render_fps"]`` = 4 decisions per second. ``gym.make(..., render_mode="human")`` shows
    the same picture in a window through gymnasium's ``HumanRendering`` wrapper (gymnasium builds the
    env with ``"rgb_array"`` and warns that it applies the wrapper), which needs pygame (``pip install
    "mooncake-gym[human]"``) and a display. ``render_mode="ansi"``: ``render()`` returns a short text
    picture of the same state.

    ## Version History

    * v0: initial version. On 2026-12-04 it gained ``engine=`` and runs on the native engine by
      default, with the same episodes (observations, rewards, infos and metrics bit for bit).
    """

    def __init__(self, load=None, load_range=None, base_trace=None, trace=None, speed: float = 1.0,
                 episode_requests: int = 2000, n_prefill: int = 8, n_decode: int = 8,
                 decode_capacity_tokens: int = 60_000, tbt_s: float = 0.05, ttft_slo_s: float = 30.0,
                 oracle: bool = False, waste_penalty: float = DEFAULT_WASTE_PENALTY, model: str = "llama2-70b",
                 render_mode: str | None = None, engine: str | None = None):
        self.load = ValueOrRange("load", load, load_range, DEFAULT_LOAD)
        check("requests", episode_requests, "episode_requests")
        check("speed", speed)
        check("waste_penalty", waste_penalty)
        if not isinstance(oracle, bool):
            raise ValueError(f"oracle: expected True or False, got {oracle!r}")
        check_render_mode(render_mode)
        self.config = OverloadConfig(n_prefill=n_prefill, n_decode=n_decode,
                                     decode_capacity_tokens=decode_capacity_tokens, tbt_s=tbt_s,
                                     ttft_slo_s=ttft_slo_s, oracle=oracle)
        self.cost = CostModel.preset(model)
        self.base = as_trace("base_trace", base_trace) if base_trace is not None else \
            synthetic_trace(0, DEMO3_BASE_RATE)
        self.trace = as_trace("trace", trace) if trace is not None else None
        # what the episodes are drawn from: the base trace's requests without their block ids (the
        # cluster caches nothing, cache_blocks=0, so they change no number; the engine then need not
        # index some 30,000 block ids at every reset)
        b = self.base
        self._draw_from = Trace(b.arrival_s, b.input_tokens, b.output_tokens, [()] * len(b), b.session_ids, b.name)
        self.capacity_rate = decode_capacity_rate(self.base, self.config.preset(self.cost))
        self.mean_prefill_s = float(np.mean([self.cost.prefill_s(n, 0) for n in self.base.input_tokens.tolist()]))
        # degenerate base traces, refused here rather than failing at every step: the waste penalty
        # is in units of the mean prefill time, and resampling draws at load x the capacity rate
        if not self.mean_prefill_s > 0:
            raise ValueError("base_trace: every request has input_length 0, so the mean prefill time (the unit "
                             "of the waste penalty) is 0; give a base trace with prompts")
        high = self.load.value if self.load.range is None else self.load.range[1]
        check("rate", high * self.capacity_rate,
              f"load x capacity rate of base_trace ({high:g} x {self.capacity_rate:.4g} requests/s)")
        # the load series of an episode is bounded before any episode: a replayed trace's span, or
        # the span of episode_requests Poisson arrivals at the lowest load (mean + 20 sd, which a
        # draw exceeds with negligible probability)
        if self.trace is not None:
            check_load_samples("trace", float(self.trace.arrival_s[-1]) / speed, self.config)
        else:
            low, n = (self.load.value if self.load.range is None else self.load.range[0]), episode_requests
            check_load_samples("episode_requests", (n + 20 * math.sqrt(n)) / (low * self.capacity_rate), self.config)
        self.speed = float(speed)
        self.episode_requests = int(episode_requests)
        self.waste_penalty = float(waste_penalty)
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(0.0, 1.0, (12 if oracle else 11,), np.float32)
        self.sim: LectureAdmission | None = None
        self._view = None
        self._viewer: AdmissionViewer | None = None
        c = self.config
        self._oracle = c.oracle
        self._denominators = (TTFT_CAP_SLO * c.ttft_slo_s, c.recent_window_s * self.capacity_rate,
                              c.recent_window_s * c.n_prefill, IN_PREFILL_CAP_PER_INSTANCE * c.n_prefill)
        self.engine = self._choose_engine(engine)
        # the buffers the native core writes (observation, its two always-legal actions, the info row)
        self._obs = np.zeros(self.observation_space.shape, np.float32)
        self._mask_buffer = np.ones(2, np.int8)
        self._info_row = np.zeros(NATIVE_INFO_FIELDS, np.float64)
        self._core = None  # the engine's core of the episode (native), else None
        self._episode = None  # the episode's trace (native: replayed with _actions when unpickled)
        self._actions: list = []

    def _choose_engine(self, engine) -> str:
        """The engine of the episodes: ``engine=`` resolved (``docs/engine.md``); the default falls
        back to the reference where the native engine cannot run this environment."""
        chosen = _engine.resolve(engine)
        if chosen != "native":
            return chosen
        # the prefill time of the pool's (first) instance, which the engine computes each request's with
        prefill = self.config.preset(self.cost).routing_config().instance_costs(self.cost)[0].prefill_time()
        try:
            why = prefill_disagrees(prefill)
            self._prefill_fields = prefill_fields(prefill)
        except ValueError as e:
            why = str(e)
        return native_or_python(engine, why)

    # -- the decision view and its encoding -----------------------------------------------------------
    def decision_view(self):
        """The simulator's view of the pending request (what hand-coded baselines read)."""
        if self._view is None and self._core is not None and not self._core.done:
            self._view = self._native_view()
        return self._view

    def _native_view(self) -> AdmissionView:
        """LectureAdmission's view of the pending request from the native core (the same fields; its
        ``simulator`` the native cluster, whose projections run in Python on the engine's records)."""
        sim, c = self.sim, self.config
        now, i, queues, best, ps, finish, ttft, rejected, rejected_after, wasted = self._core.view()
        cluster = sim.cluster
        used = tuple(cluster._cluster.used())
        in_prefill, in_decode = cluster._cluster.counters()[8:10]
        return AdmissionView(now, i, sim._input[i], sim._output[i] if c.oracle else None, sum(used),
                             sim._decode_pool_capacity_tokens, used, c.decode_capacity_tokens, queues, best, ps,
                             finish, ttft, c.ttft_slo_s, rejected, rejected_after, wasted, in_prefill, in_decode,
                             sim.mean_decode_s, sim.mean_output_tokens, cluster)

    def encode_action(self, admit) -> int:
        """The env action for a baseline's answer, checked by ``views.check_admit``."""
        return 1 if check_admit(admit) else 0

    def _observe(self) -> np.ndarray:
        # The hot path of ``step``: plain Python floats into one list, one float32 array at the end
        # (a fresh one each step: the caller may keep it). The denominators are computed once in
        # ``__init__`` by the same expressions; the clips are ``clip01``.
        if self._core is not None:
            return self._obs.copy()
        v = self._view
        if v is None:
            return np.zeros(self.observation_space.shape, np.float32)
        cap = v.decode_pool_capacity_tokens
        per = v.decode_capacity_per_instance
        finish = v.predicted_prefill_finish
        ttft_den, rejected_den, wasted_den, in_prefill_den = self._denominators
        uniform, expected = v.simulator.decode_token_projections(finish, v.mean_decode_s)  # the cluster's
        vals = [
            v.decode_used_tokens / cap,
            uniform / cap,
            expected / cap,
            v.predicted_ttft_s / ttft_den,
            (per - min(v.decode_used_per_instance)) / per,
            (v.input_tokens + v.mean_output_tokens) / per,
            math.log1p(v.input_tokens) / LOG1P_INPUT_TOKENS_CAP,
            v.recent_rejected / rejected_den,
            v.recent_wasted_s / wasted_den,
            v.requests_in_prefill / in_prefill_den,
            1.0 if v.predicted_ttft_s > v.ttft_slo_s else 0.0,
        ]
        if self._oracle:
            vals.append(v.output_tokens / OUTPUT_TOKENS_CAP)
        # as_clipped_float32(vals), inlined: each clipped to [0, 1] (clip01), packed by this size's packer
        return np.frombuffer(bytearray(_PACK[len(vals)](*[0.0 if x < 0.0 else (1.0 if x > 1.0 else x) for x in vals])),
                             np.float32)

    # -- Gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        trace, load = episode_workload(self.np_random, options, self.trace, self.speed, self._draw_from,
                                       self.episode_requests, self.load, self.capacity_rate)
        self._episode = trace
        self._start(self.engine == "native")
        return self._observe(), {"requests": len(trace), "load": load, "capacity_rate_per_s": self.capacity_rate}

    def _start(self, native: bool) -> None:
        """Begin the episode drawn at reset (:attr:`_episode`) at its first arrival: on the native core
        where ``native`` and the engine runs its cluster, else on the reference."""
        trace = self._episode
        self._core = None
        self._actions = []
        self._granted = 0
        self._wasted = 0.0
        self._doomed: list = []  # (prefill finish, request, prefill s) of admitted requests doomed to miss the SLO
        self.sim = sim = LectureAdmission(trace, self.config, self.cost, engine=None if native else "python")
        cluster = sim.cluster
        if type(cluster) is not NativeClusterSimulator:  # (None for an empty trace)
            self._view = sim.reset()
            return
        # the engine's core over the native cluster (just constructed and reset: LectureAdmission.reset's state)
        sim._started, sim._fresh = True, False
        c = self.config
        ttft_den, rejected_den, wasted_den, in_prefill_den = self._denominators
        spec = {"pool_capacity_tokens": c.decode_pool_capacity_tokens, "capacity_tokens": c.decode_capacity_tokens,
                "ttft_slo_s": c.ttft_slo_s, "recent_window_s": c.recent_window_s, "tbt_s": cluster.preset.tbt_s,
                "oracle": c.oracle, "mean_output_tokens": sim.mean_output_tokens, "mean_decode_s": sim.mean_decode_s,
                "projection_output_tokens": cluster.mean_output_tokens, "ttft_den": ttft_den,
                "rejected_den": rejected_den, "wasted_den": wasted_den, "in_prefill_den": in_prefill_den,
                "log1p_input_cap": LOG1P_INPUT_TOKENS_CAP, "output_cap": OUTPUT_TOKENS_CAP,
                "waste_penalty": self.waste_penalty, "mean_prefill_s": self.mean_prefill_s}
        self._core = core = _engine.native.AdmissionEnv(cluster._cluster, spec, self._prefill_fields,
                                                        cluster._survival_table())
        sim._prefill_s = core.prefill_times()  # (the same as the pool's uncached_prefill_s(0): tested)
        core.bind(self._obs, self._mask_buffer, self._info_row)
        self._view = None  # (made from the core when asked: decision_view)

    def __getstate__(self) -> dict:
        """A native episode pickles as the trace reset drew and the actions taken since (the engine's
        state is not picklable); unpickling replays them on a new core, which gives the same state."""
        state = self.__dict__.copy()
        if state.get("_core") is not None:
            state["_core"] = state["sim"] = state["_view"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        # (an env pickled before the engine ran it: its episode on the reference)
        for k, v in (("engine", "python"), ("_core", None), ("_episode", None), ("_actions", [])):
            state.setdefault(k, v)
        self.__dict__.update(state)
        if self.sim is None and self._episode is not None and self.engine == "native":
            # its own buffers (not the pickled ones'), then the episode replayed
            self._obs, self._mask_buffer, self._info_row = (self._obs.copy(), self._mask_buffer.copy(),
                                                            self._info_row.copy())
            actions = self._actions
            self._start(native=True)
            for a in actions:
                self._core.step(a)
            self._actions = actions

    def step(self, action):
        if self.sim is None:
            raise RuntimeError("step: call reset() first")
        # fast path for Python and numpy integers; anything else goes through the space's own check
        if not ((action == 0 or action == 1) if type(action) in INTEGER_TYPES else in_space(self.action_space, action)):
            raise ValueError(f"action: expected 0 (reject) or 1 (admit), got {action!r}")
        core = self._core
        if core is not None:  # the engine applies the decision, writes the observation, makes the reward and info
            a = int(action)
            try:
                reward, terminated, info = core.step(a)
            except IndexError:  # the core's "trace is exhausted"
                raise RuntimeError("step: the episode has terminated; call reset()") from None
            self._actions.append(a)
            self._view = None
            cluster = self.sim.cluster
            cluster._view = cluster._cached = None  # the native cluster's Python caches of the last decision
            if terminated:
                info["metrics"] = self.sim.result("env").metrics
            return self._obs.copy(), reward, terminated, False, info
        if self.sim.done:
            raise RuntimeError("step: the episode has terminated; call reset()")
        admit = int(action) == 1
        view = self._view
        doomed = 0.0
        if admit and view.predicted_ttft_s > view.ttft_slo_s:
            # certain to miss the TTFT SLO (the prediction is exact): its prefill can never count
            # as goodput, so it is charged as waste now, when that is known
            doomed = view.prefill_s
            heapq.heappush(self._doomed, (view.predicted_prefill_finish, view.index, doomed))
        sim = self.sim
        self._view = sim.step(admit)
        c = sim.cluster  # its counters read directly (the admission problem's properties name them)
        assert c is not None  # a trace with requests: there was a decision to make
        granted = c.granted_in_ttft_slo - self._granted
        wasted = c.wasted_prefill_s - self._wasted
        self._granted, self._wasted = c.granted_in_ttft_slo, c.wasted_prefill_s
        # a doomed request later rejected after prefill was charged already: its prefill is taken
        # out of this step's waste (its outcome is settled by its prefill finish)
        doomed_heap = self._doomed
        if doomed_heap:
            settled = math.inf if self._view is None else self._view.now
            outcome = c.outcome
            while doomed_heap and doomed_heap[0][0] <= settled:
                _, i, prefill = heapq.heappop(doomed_heap)
                if outcome[i] == REJECTED_AFTER_PREFILL:
                    wasted -= prefill
        if wasted < 1e-9:  # what is left of a difference of float sums when only doomed requests were wasted
            wasted = 0.0
        reward = granted - self.waste_penalty * (doomed + wasted) / self.mean_prefill_s
        terminated = c.done
        info = {"index": view.index, "admitted": admit, "granted": granted, "doomed_s": doomed, "wasted_s": wasted,
                "completed": c.granted, "rejected_at_arrival": c.rejected_at_arrival,
                "rejected_after_prefill": c.rejected_after_prefill}
        if terminated:
            info["metrics"] = sim.result("env").metrics
        return self._observe(), float(reward), bool(terminated), False, info

    def _frame(self) -> np.ndarray:
        """The two pools as an RGB picture (``render_mode="rgb_array"``; ``envs/viewer.py``)."""
        c, sim, v = self.config, self.sim, self.decision_view()
        if self._viewer is None:
            self._viewer = AdmissionViewer(c.n_prefill, c.n_decode, c.ttft_slo_s, c.tbt_s)
        decided = v.index if v is not None else len(sim.trace)  # requests decided so far
        last = None if decided == 0 else sim.outcome[decided - 1] != REJECTED_AT_ARRIVAL
        counts = (sim.completed, sim.rejected_at_arrival, sim.rejected_after_prefill)
        if v is None:  # the episode is over and drained
            end = float(sim.trace.arrival_s[-1]) if len(sim.trace) else 0.0
            return self._viewer.frame(end, decided, len(sim.trace), None, [0.0] * c.n_prefill, None, 0.0,
                                      [0.0] * c.n_decode, 0.0, last, *counts)
        per = v.decode_capacity_per_instance
        return self._viewer.frame(v.now, decided, len(sim.trace), v.input_tokens, v.prefill_queue_s,
                                  v.prefill_instance, v.prefill_s, [u / per for u in v.decode_used_per_instance],
                                  v.predicted_ttft_s, last, *counts)

    def _picture(self) -> str:
        """The text picture of the current state (``render_mode="ansi"``)."""
        v = self.decision_view()
        if v is None:
            m = self.sim.result("env").metrics
            return (f"done: completed {m['completed']}, rejected {m['rejected_at_arrival']} at arrival and "
                    f"{m['rejected_after_prefill']} after prefill, wasted {m['wasted_prefill_s']:.0f} s")
        per = v.decode_capacity_per_instance
        lines = [f"t={v.now:8.2f}s  request {v.index}  input {v.input_tokens} tok  predicted TTFT "
                 f"{v.predicted_ttft_s:.1f}s  decode {v.decode_load:4.0%}"]
        for i, used in enumerate(v.decode_used_per_instance):
            lines.append(f"  decode [{i}] {'#' * int(20 * used / per):<20s} {used / per:4.0%}")
        lines.append("  prefill queues s: " + " ".join(f"{q:5.1f}" for q in v.prefill_queue_s))
        return "\n".join(lines)
