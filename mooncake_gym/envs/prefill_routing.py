"""``mooncake_gym/PrefillRouting-v0``: KV-cache-aware prefill routing as a Gymnasium environment."""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

from mooncake_gym import _engine
from mooncake_gym._engine import routing as _native_routing
from mooncake_gym._engine.stepper import NativeRoutingSimulator
from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.sim.credit import QueueCredit
from mooncake_gym.sim.observation import as_observation
from mooncake_gym.sim.routing import RoutingConfig, RoutingSimulator, RoutingView, check_route
from mooncake_gym.envs.common import (FeedbackChannel, INTEGER_TYPES, in_space, PicturedEnv, WorkloadSpec, as_float32,
                                      check, check_render_mode, native_or_python)
from mooncake_gym.envs.features import PER_INSTANCE_FEATURES, QUEUE_CAP_SLO, TIME_UNIT_S, routing_features
from mooncake_gym.envs.viewer import RoutingViewer

#: The native engine's info row of a step: RoutingSimulator.last's fields and types, in this order
#: (engine.hpp RoutingEnv; the vector env's interface, envs/vector.py).
NATIVE_INFO = (("index", int), ("instance", int), ("pull", bool), ("ttft_s", float), ("queue_s", float),
               ("transfer_s", float), ("prefill_s", float), ("hit_tokens", int), ("fetched_tokens", int),
               ("input_tokens", int))
NATIVE_INFO_FIELDS = len(NATIVE_INFO)
#: The rewards of ``reward=`` (the class docstring's Rewards).
REWARDS = ("ttft", "slo", "credit")


class PrefillRoutingEnv(FeedbackChannel, PicturedEnv):
    """
    ## Description

    A cluster of ``n_instances`` prefill instances, each with a FIFO queue and a local LRU prefix
    cache of ``cache_blocks`` 512-token KV blocks, serves LLM requests (Mooncake, arXiv 2407.00079,
    §6). One step is one arriving request: the agent picks the instance that prefills it and, unless
    ``allow_pull=False``, whether to first pull the longest prefix cached anywhere in the cluster
    over RDMA (hot-spot replication, Algorithm 1). The time of everything comes from
    ``mooncake_gym.model.costmodel``; the simulation is ``mooncake_gym.sim.routing.RoutingSimulator``, the
    same object that runs the hand-coded baselines. By default the agent sees the cluster's exact
    state and every instance is an 8 x A800 node; ``observation=`` gives it what a deployed router
    sees instead (stale load, its own prefix index, noisy estimates: Observation Modes) and
    ``instances=`` makes the pool heterogeneous (Heterogeneous Pools).

    ## Action Space

    ``Discrete(2 * n_instances)`` (``Discrete(n_instances)`` with ``allow_pull=False``): action
    ``a < n_instances`` sends the request to instance ``a``; ``a >= n_instances`` sends it to
    instance ``a - n_instances`` after pulling the best prefix there. A pull where the instance
    already holds the best prefix costs nothing and does nothing. Every action is legal; an action
    outside the space (or not an integer) raises ``ValueError``.

    ## Action Masks

    ``action_masks()`` (the protocol of sb3-contrib's ``MaskablePPO``) returns a bool array of
    ``action_space.n`` entries, and the info of every ``reset`` and ``step`` carries the same as
    ``info["action_mask"]`` (int8), both for the decision the returned observation describes. Every
    plain action ``i`` is valid. A pull action ``n_instances + i`` is masked (0) when instance
    ``i``'s prefix hit, as the agent sees it, is not shorter than the longest prefix anywhere: such a
    pull copies nothing and is exactly the plain action ``i``, so masking it removes a duplicate,
    not a choice. Masked actions stay legal: taken anyway, a masked pull acts as the plain action.
    Under the ``approximate`` and ``precise`` observation modes the mask follows the agent's view: a
    pull it allows may find nothing more to copy (it then acts as the plain action too), and one it
    masks may miss a longer prefix the router does not know of. With ``allow_pull=False`` all
    ``n_instances`` actions are valid; with no decision pending (after the last request) every entry
    is 1.

    ## Observation Space

    A ``Box(0, 1, (5 * n_instances + 2,), float32)``; block ``i`` (indices ``5i .. 5i+4``) describes
    instance ``i``, the last two entries the request. SLO = ``ttft_slo_s``; features at or above
    their cap read 1. Times are log-scaled so that differences of a tenth of a second stay visible
    at any load: ``T(s) = min(1, log1p(s / 0.1) / log1p(10 SLO / 0.1))``.

    | index | feature | unit, scaling | range |
    |---|---|---|---|
    | 5i | queued prefill work on i | T(s) | [0, 1] |
    | 5i+1 | requests on i not finished (queued or in service) | count / 50 | [0, 1] |
    | 5i+2 | local prefix hit on i | hit tokens / input tokens | [0, 1] |
    | 5i+3 | estimated TTFT on i without pull | T(s) | [0, 1] |
    | 5i+4 | estimated TTFT on i after pulling the best prefix | T(s) | [0, 1] |
    | 5N | request length | log1p(input tokens) / log1p(200,000) | [0, 1] |
    | 5N+1 | longest prefix cached anywhere | hit tokens / input tokens | [0, 1] |

    The TTFT estimates are Algorithm 1's: queue + transfer + prefill time; in this simulator, with
    the default ``observation="exact"``, they are exact. Feature 5i+4 equals 5i+3 where instance i
    already holds the best prefix; with ``allow_pull=False`` it still reads what a pull would give
    (the action cannot take it). After the last request the observation is all zeros.

    These are Algorithm 1's inputs, per instance. An earlier version also had, per instance, each
    estimate minus the best estimate anywhere (7 features per instance); a PPO agent trained on the 5
    learns as well in the full 1.2 M steps (on the training callback's held-out episodes at 8
    sessions/s its best return was -85.3 against the 7-feature agent's -85.7 and ``kvcentric``'s -83.4),
    though more slowly (50,000 steps reach -98.4 against -90.9 with the 7 features, same seed), and
    the environment steps about 14 % faster without them. A wrapper can add such a
    comparison back (``docs/tutorial.md``, exercise 6).

    ## Observation Modes

    ``observation=`` sets what the observation, ``info["action_mask"]`` and ``decision_view()`` (what
    the baselines read) show; the service of every request stays exact. ``"exact"`` (default): the
    simulator's state, as in every earlier version. Otherwise parts of ``"scraped"``,
    ``"approximate"`` or ``"precise"``, and ``"noisy"`` joined by ``+``, optionally followed by
    ``mooncake_gym.sim.observation.ObservationConfig`` fields after commas
    (``"scraped+noisy,scrape_delay_s=0.5,noise_sigma=0.3"``), or a dict of those fields, or an
    ``ObservationConfig``. The module ``mooncake_gym.sim.observation`` gives each estimate exactly, with
    its sources.

    | mode | what the agent sees instead | imitates |
    |---|---|---|
    | ``scraped`` | load (5i, 5i+1 and the queue part of 5i+3, 5i+4) from snapshots taken every ``scrape_period_s`` (0.1 s) and seen ``scrape_delay_s`` (0 s) late, plus the router's own count of what it sent since: queue = max(0, snapshot - time since) + estimated service of the requests sent since; with ``routers=K``, K routers take turns (round robin), each with its own snapshots (phases spread over the period) and its own count | llm-d's endpoint picker polling the servers' metrics (every 50 ms by default) and counting its own requests, as Dynamo's KV router does |
    | ``approximate`` | prefix hits (5i+2, 5N+1 and the TTFT estimates) from the router's own index of the blocks it routed to each instance, an LRU of ``index_capacity_blocks`` (unbounded) with entries expiring after ``index_ttl_s`` (never): blocks a cache has evicted still count | SGLang's cache-aware router, llm-d's approximate prefix-cache scorer, Dynamo without KV events |
    | ``precise`` | the same fields from the instances' KV-cache events, applied ``kv_event_delay_s`` (0.1 s) late | llm-d's precise prefix-cache scorer, Dynamo's KV indexer |
    | ``noisy`` | the TTFT estimates (5i+3, 5i+4) with the predicted prefill and transfer times each multiplied by ``exp(noise_sigma z)``, z standard normal (``noise_sigma`` 0.3), drawn from a generator spawned from the env's ``np_random`` | routers ranking instances by a predicted TTFT (Mooncake's Conductor) |

    Sources: llm-d's endpoint picker polls metrics every ``refreshMetricsInterval``, 50 ms by default
    (Gateway API Inference Extension, ``pkg/epp/server/runserver.go``); Dynamo's docs, "Router Design"
    (router-side block tracking; ``KvIndexer`` fed by worker KV events) and its ``--no-kv-events`` mode
    (``ApproxKvIndexer``, entries expiring after ``--router-ttl-secs``, 120 s); SGLang's
    ``sgl-model-gateway/src/policies/cache_aware.rs`` (an approximate radix tree per worker built from
    the requests it routed, trimmed to ``--max-tree-size`` every ``--eviction-interval``); llm-d's docs,
    "Prefix-Cache Aware Routing" (an LRU index of the prefixes sent to each pod) and "KV-Cache
    Indexer" (the precise scorer on vLLM's KV events).
    
    A hand-coded baseline run through the environment sees the same view as through
    ``mooncake_gym.sim.routing.simulate(..., observation=...)`` and gives the same numbers.

    ## Heterogeneous Pools

    ``instances="4xH800+4xA800"`` (or a list of GPU names or ``mooncake_gym.model.costmodel.InstanceSpec``)
    puts instances of different GPUs in one cluster: each prefills at its own speed (its estimates
    in the observation carry it), while the model, the block size and the RDMA network are the
    cluster's; ``n_instances`` is then the list's length. ``cache_blocks`` may be one capacity per
    instance. The observation's shape and meaning do not change.

    ## Rewards

    ``reward="ttft"`` (default): ``-TTFT / ttft_slo_s`` of the request just dispatched, so the
    return is minus the episode's total TTFT in SLO units. ``reward="slo"``: 1 if that TTFT is
    within the SLO, else 0 (the return counts requests within the SLO).

    ``reward="credit"``: each request is charged for the queueing delay it imposes
    (``mooncake_gym.sim.credit``). On a FIFO instance a waiting request waits exactly through the parts
    of the services of the requests ahead of it that overlap its wait, so a request's charge is its
    own service (transfer + prefill) plus, for every later request on its instance, the overlap of its
    service with that request's wait; the charges of an episode sum to exactly its total TTFT. A
    charge is final when the request's service ends (no later arrival waits for it); each step's
    reward is ``-(sum of the charges that became final by the next decision's arrival) / ttft_slo_s``
    (the last step pays every charge left), and ``info["credited"]`` lists them as ``(request index,
    charge s)`` in the order their services ended. The return is the same as with ``"ttft"``: minus the
    episode's total TTFT in SLO units; only when each part is paid, and to which decision it is
    owed, differ (a learner that attributes each charge to its decision's step, rather than to the
    step it is paid at, gets the decision's whole cost, including what it costs the requests behind
    it; ``reward="ttft"`` charges each wait to the request that suffers it, which makes the greedy
    choice look optimal). With it the episode is stepped from Python over either engine (the
    native engine's env core computes only the other two rewards): the same numbers on both.

    ## Info

    ``reset`` returns ``{"requests", "rate_per_s", "action_mask"}`` (the episode's request count and
    mean requests/s, and the first decision's mask). Each ``step`` returns the dispatched request's
    outcome: ``index``, ``instance``, ``pull`` (whether blocks were fetched), ``ttft_s``,
    ``queue_s``, ``transfer_s``, ``prefill_s``, ``hit_tokens`` (local hit, or the best prefix after a
    pull), ``fetched_tokens`` and ``input_tokens`` (the truth, whatever the observation mode), and
    ``action_mask`` of the next decision; the final step adds ``metrics``.

    ## Starting State

    Empty queues and empty caches. The episode's workload is drawn at ``reset`` from the env's
    ``np_random``: a synthetic trace at ``rate`` sessions/s (or a rate drawn uniformly from
    ``rate_range``), or the given ``trace`` replayed at ``speed``; ``reset(options={"trace": ...})``
    replays a trace for one episode. A replayed trace runs whole (``episode_requests`` only cuts
    synthetic episodes), unless ``window_requests=N``: then each episode replays N consecutive
    requests of it from an offset drawn uniformly from ``np_random`` (or given as
    ``reset(options={"offset": k})``), shifted to start at time 0. ``arrivals=`` (a dict of
    ``mooncake_gym.model.workload.BurstyArrivals`` fields: ``burst_ratio``, ``calm_s``, ``burst_s``)
    makes the synthetic sessions arrive as a two-state Markov-modulated Poisson process with the
    same mean rate (bursts of ``burst_ratio`` times the calm rate); a dict of ``DiurnalArrivals``
    fields (``amplitude``, ``period_s``) as a Poisson process whose rate is the mean times
    ``1 - amplitude x cos(2 pi t / period_s)``.

    ## Episode End

    ``terminated`` when the last request of the workload has been dispatched; ``truncated`` only
    from a ``max_episode_steps`` given to ``gym.make``. The final step's ``info["metrics"]`` holds
    the routing simulator's metrics (mean/p50/p90/p99 TTFT, SLO attainment, hit ratio, computed and
    fetched tokens, utilisation).

    ## Arguments

    ``gym.make("mooncake_gym/PrefillRouting-v0", n_instances=None, cache_blocks=3000, ttft_slo_s=5.0,
    rate=None, rate_range=None, trace=None, speed=1.0, episode_requests=1000, duration_s=600.0,
    allow_pull=True, reward="ttft", model="llama2-70b", render_mode=None, observation=None,
    instances=None, arrivals=None, window_requests=None, engine=None)``. ``n_instances=None`` means 8, or the length of ``instances``;
    ``cache_blocks`` is one capacity or one per instance; ``observation`` and ``instances`` are
    described above (None: exact, and every instance the model's default 8 x A800 node). With neither ``rate``
    nor ``rate_range`` nor ``trace`` the rate is 4 sessions/s (a session issues about 2.1 requests).
    ``episode_requests=None`` generates ``duration_s`` seconds of sessions instead (lecture demo 2
    uses 600 s). ``model`` is a preset of ``mooncake_gym.model.costmodel.MODELS``. ``render_mode="ansi"``:
    ``render()`` returns a text picture; ``"rgb_array"``: a picture of the cluster (see Rendering).
    An invalid argument raises ``ValueError`` naming it and its allowed range.

    ``engine``: which simulator runs the episodes (``docs/engine.md``). ``"native"``: the C++ engine,
    which writes the observation, the action mask and the info row into the env's buffers and
    computes the reward (the exact observation only: another ``observation`` with it is a
    ``ValueError``); ``"python"``: the reference ``RoutingSimulator``; None (default): native where
    the engine is built and the observation is exact, else the reference. Both give the same
    episodes, observation for observation, reward for reward and info for info.

    ## Snapshots

    ``snapshot()`` returns an opaque copy of the episode's state (the simulator's, on either
    engine: the native one copies its arrays, the reference deep-copies itself) and
    ``restore(s)`` returns to it and gives back the observation of the pending decision; the same
    actions then give the same steps (look-ahead rollouts, counterfactual rewards).

    ## Rendering

    ``render_mode="rgb_array"``: ``render()`` returns a picture of the cluster, a ``(400, W, 3)``
    uint8 array (W = 640 pixels up to 100 instances, wider beyond; a multiple of 16 for video
    encoders). Per instance, one column: a bar of its queued work with this request's prefill time
    on it stacked in a lighter blue, together Algorithm 1's TTFT estimate without a pull (the top of
    the scale is the TTFT SLO; a red cap marks more); the request's local prefix hit (orange gauge)
    and the cache's occupancy (green gauge). The column of the instance that took the last request
    is highlighted, with a purple stripe on top if it pulled blocks first; the header gives the
    time, the request count and the last request's TTFT. A frame takes about a millisecond
    (``benchmarks/bench_render.py``). Videos: gymnasium's ``RecordVideo`` wrapper, which needs
    moviepy (``pip install "mooncake-gym[video]"``); a video plays at ``metadata["render_fps"]`` = 4
    decisions per second. ``gym.make(..., render_mode="human")`` shows the same picture in a window
    through gymnasium's ``HumanRendering`` wrapper (gymnasium builds the env with ``"rgb_array"``
    and warns that it applies the wrapper), which needs pygame (``pip install
    "mooncake-gym[human]"``) and a display. ``render_mode="ansi"``: ``render()`` returns a short
    text picture of the same state.

    ## Version History

    * v0: initial version. Until 2026-11-29 its observation had 7 features per instance (the two
      extra: each estimate minus the best estimate anywhere); agents trained on that observation
      are refused with a message to retrain them. On 2026-11-30 it gained ``observation=``,
      ``instances=``, per-instance ``cache_blocks``, ``action_masks()`` and ``info["action_mask"]``; with
      their defaults every observation, reward and earlier info entry is unchanged (info gains
      ``action_mask``). On 2026-12-01 it gained ``arrivals=`` (bursty sessions), ``window_requests=``
      (a window of a replayed trace per episode, ``reset(options={"offset": k})``) and the
      observation setting ``routers=`` (several routers, each with its own scraped view); with
      their defaults nothing changes. On 2026-12-03 it gained ``engine=``, ``snapshot()`` and
      ``restore()``, and runs on the native engine by default, with the same episodes. Later that
      day it gained ``reward="credit"`` (the default reward and every existing reward, observation
      and info are unchanged).
    """

    NATIVE_INFO = NATIVE_INFO

    def __init__(self, n_instances: int | None = None, cache_blocks=3000, ttft_slo_s: float = 5.0, rate=None,
                 rate_range=None, trace=None, speed: float = 1.0, episode_requests: int | None = 1000,
                 duration_s: float = 600.0, allow_pull: bool = True, reward: str = "ttft",
                 model: str = "llama2-70b", render_mode: str | None = None, observation=None, instances=None,
                 arrivals=None, window_requests=None, engine=None):
        check("n_instances", n_instances, allow_none=True)
        if not isinstance(cache_blocks, (list, tuple, np.ndarray)):  # one per instance: RoutingConfig checks each
            check("cache_blocks", cache_blocks)
        check("ttft_slo_s", ttft_slo_s)
        if reward not in REWARDS:
            raise ValueError(f"reward: expected one of {', '.join(map(repr, REWARDS))}, got {reward!r}")
        check_render_mode(render_mode)
        self.config = RoutingConfig(n_instances=n_instances, cache_blocks=cache_blocks, ttft_slo_s=ttft_slo_s,
                                    instances=instances)
        n_instances = self.config.n_instances
        self.observation = as_observation(observation)
        self.cost = CostModel.preset(model)
        self.workload = WorkloadSpec(rate, rate_range, trace, speed, episode_requests, duration_s,
                                     arrivals=arrivals, window_requests=window_requests)
        self.allow_pull = bool(allow_pull)
        self.reward_kind = reward
        self._ttft_reward, self._slo, self._n_instances = reward == "ttft", float(ttft_slo_s), int(n_instances)
        self._credit: QueueCredit | None = None  # reward="credit": the episode's open charges
        self._arrivals: list[float] = []
        self.render_mode = render_mode
        n = n_instances
        self.action_space = spaces.Discrete(2 * n if self.allow_pull else n)
        self._n_actions = int(self.action_space.n)
        self.observation_space = spaces.Box(0.0, 1.0, (PER_INSTANCE_FEATURES * n + 2,), np.float32)
        self._time_scale = 1.0 / math.log1p(QUEUE_CAP_SLO * ttft_slo_s / TIME_UNIT_S)
        self.sim: RoutingSimulator | NativeRoutingSimulator | None = None
        self._viewer: RoutingViewer | None = None
        self._last_info: dict = {}
        self._costs = self.config.instance_costs(self.cost)
        self.engine = self._choose_engine(engine)
        # the buffers the native engine writes (a vector env hands each env rows of its own: _use_buffers)
        self._use_buffers(np.zeros(self.observation_space.shape, np.float32), np.ones(self._n_actions, np.int8),
                          np.zeros(NATIVE_INFO_FIELDS, np.float64))
        self._core = None  # the engine's env core of the episode (native), else None

    def _choose_engine(self, engine) -> str:
        """The engine of the episodes: ``engine=`` resolved (``docs/engine.md``); the default falls
        back to the reference where the native engine cannot run this environment."""
        chosen = _engine.resolve(engine)
        if chosen != "native":
            return chosen
        why = None
        if not self.observation.exact:
            why = "the native engine shows the exact observation only (observation modes run in Python)"
        else:
            try:
                why = next(filter(None, (_native_routing.prefill_disagrees(c.prefill_time()) for c in self._costs)), None)
            except ValueError as e:
                why = str(e)
        return native_or_python(engine, why)

    def _use_buffers(self, obs: np.ndarray, mask: np.ndarray, info: np.ndarray) -> None:
        """Where the native engine writes this env's observation, action mask and info row (float32
        of the observation's size, int8 of the actions', float64 of NATIVE_INFO_FIELDS)."""
        self._obs, self._mask_buffer, self._info_row = obs, mask, info
        core = getattr(self, "_core", None)
        if core is not None:
            core.bind(obs, mask, info)

    # -- the decision view and its encoding ---------------------------------------------------------
    def decision_view(self) -> RoutingView | None:
        """The simulator's view of the pending request (what hand-coded baselines read)."""
        return None if self.sim is None else self.sim.view

    def encode_action(self, route) -> int:
        """The env action for a baseline's answer (an instance or a ``Route``). With
        ``allow_pull=False`` the env cannot express a pull, so a ``Route(i, True)`` becomes plain
        instance ``i``: kvcentric through such an env runs without its transfer branch."""
        inst, pull = check_route(route, self.config.n_instances)
        return inst + (self.config.n_instances if pull and self.allow_pull else 0)

    def _observe(self) -> np.ndarray:
        if self._core is not None:
            return self._obs.copy()
        v = self.sim.view
        if v is None:
            return np.zeros(self.observation_space.shape, np.float32)
        return as_float32(routing_features(v, self._time_scale))

    # -- Gymnasium API ------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        trace = self.workload.draw(self.np_random, options)
        # the observation's noise, if any, from a generator spawned from np_random (its stream untouched)
        rng = self.np_random.spawn(1)[0] if self.observation.noisy else None
        self._core = None
        if self.reward_kind == "credit":
            self._credit = QueueCredit(self._n_instances)
            self._arrivals = trace.arrival_s.tolist()
        if self.engine == "native" and self._fits_native(trace):
            self.sim = NativeRoutingSimulator(trace, self.config, self.cost, costs=self._costs)
            if self._credit is None:  # (the credit is kept here: the native simulator is stepped from Python)
                self._start_core()
        else:
            self.sim = RoutingSimulator(trace, self.config, self.cost, self.observation, rng)
        self._last_info: dict = {}
        return self._observe(), {"requests": len(trace), "rate_per_s": trace.rate, "action_mask": self._mask()}

    def _engine_steps(self) -> int | None:  # FeedbackChannel's
        if not isinstance(self.sim, NativeRoutingSimulator):
            return None
        view = self.sim.view
        return 0 if view is None else view.index

    def _to_reference(self) -> None:  # FeedbackChannel's: the episode's trace, from its start, on the reference
        self._core = None
        self.sim = RoutingSimulator(self.sim.trace, self.config, self.cost, self.observation, None)

    def _end_info(self) -> dict:
        """What the last step's info adds when the episode ends (the vector env's interface)."""
        return {"metrics": self.sim.result("env").metrics}

    def _fits_native(self, trace) -> bool:
        """Whether the engine's cache arrays hold this trace (else the episode runs on the reference)."""
        cells = _native_routing.native_trace(trace).n_unique * sum(b > 0 for b in self.config.instance_cache_blocks())
        return cells <= _native_routing.MAX_CACHE_CELLS

    def _start_core(self) -> None:
        """The engine's env core over the native simulator, writing into this env's buffers."""
        self._core = _engine.native.RoutingEnv(self.sim._engine, self._time_scale, self._slo, self._ttft_reward,
                                               self.allow_pull)
        self._core.bind(self._obs, self._mask_buffer, self._info_row)

    def step(self, action):
        sim = self.sim
        if sim is None:
            raise RuntimeError("step: call reset() first")
        # fast path for Python and numpy integers; anything else goes through the space's own check
        if type(action) in INTEGER_TYPES and 0 <= action < self._n_actions:
            a = int(action)
        elif in_space(self.action_space, action):
            a = int(action)
        else:
            raise ValueError(f"action: expected an integer in 0..{self.action_space.n - 1}, got {action!r}")
        if sim.done:
            raise RuntimeError("step: the episode has terminated; call reset()")
        core = self._core
        if core is not None:  # the engine writes the observation and mask and makes the info and reward
            reward, terminated, info = core.step(a)
            if terminated:
                info.update(self._end_info())
            info["action_mask"] = self._mask_buffer.copy()
            self._last_info = info
            return self._obs.copy(), reward, terminated, False, info
        n = self._n_instances
        terminated = sim.dispatch(a % n, a >= n) is None
        info = sim.last  # a fresh dict every step: the caller may keep it
        ttft = info["ttft_s"]
        if self._credit is not None:
            k = info["index"]
            self._credit.record(k, self._arrivals[k], info["instance"], info["queue_s"], ttft)
            info["credited"] = paid = self._credit.pay(math.inf if terminated else self._arrivals[k + 1])
            reward = -sum(c for _, c in paid) / self._slo
        elif self._ttft_reward:
            reward = -ttft / self._slo
        else:
            reward = 1.0 if ttft <= self._slo else 0.0
        if terminated:
            info["metrics"] = sim.result("env").metrics
        info["action_mask"] = self._mask()
        self._last_info = info
        return self._observe(), reward, terminated, False, info

    def action_masks(self) -> np.ndarray:
        """Which actions of the pending decision do something different (sb3-contrib ``MaskablePPO``'s
        protocol): every instance, and a pull only to an instance whose prefix hit, as the policy
        sees it, is shorter than the longest one anywhere. Bool, ``action_space.n`` long."""
        return self._mask().astype(bool)

    def _mask(self) -> np.ndarray:
        if self._core is not None:
            return self._mask_buffer.copy()
        n = self._n_instances
        v = None if self.sim is None else self.sim.view
        if not self.allow_pull:
            return np.ones(n, np.int8)
        if v is None:  # no decision pending (before reset, after the last request)
            return np.ones(2 * n, np.int8)
        best = v.best_hit_tokens
        return np.frombuffer(bytearray([1] * n + [h < best for h in v.hit_tokens]), np.int8)

    def _frame(self) -> np.ndarray:
        """The cluster as an RGB picture (``render_mode="rgb_array"``; ``envs/viewer.py``)."""
        if self._viewer is None:
            self._viewer = RoutingViewer(self.config.n_instances, self.config.ttft_slo_s)
        sim, v, li = self.sim, self.sim.exact_view, self._last_info  # the cluster as it is, whatever the agent sees
        if v is not None:
            now, input_tokens, queue, prefill = v.now, v.input_tokens, v.queue_s, v.prefill_s
            hit = [h / v.input_tokens if v.input_tokens else 0.0 for h in v.hit_tokens]
            cache = self._pool(now)[1]
        else:  # the episode is over: the queues as the last request left them
            now = float(sim.trace.arrival_s[-1]) if len(sim.trace) else 0.0
            queue, cache = self._pool(now)
            input_tokens = 0
            prefill = hit = [0.0] * self.config.n_instances
        return self._viewer.frame(now, self._request_index(), len(sim.trace), input_tokens, queue, prefill, hit, cache,
                                  chosen=li.get("instance"), pulled=bool(li.get("pull")),
                                  last_ttft_s=li.get("ttft_s"))

    def _request_index(self) -> int:
        """The pending request's index (the trace's length after the last)."""
        return self.sim._engine.index if isinstance(self.sim, NativeRoutingSimulator) else self.sim._i

    def _pool(self, now: float) -> tuple[list[float], list[float]]:
        """Each instance's queued work at ``now`` and its cache's fill (held / capacity; 0 for none)."""
        if isinstance(self.sim, NativeRoutingSimulator):
            queues, blocks = self.sim.pool_state(now)
        else:
            queues = [inst.queue_s(now) for inst in self.sim.instances]
            blocks = [len(inst.cache) for inst in self.sim.instances]
        return queues, [b / c if c else 0.0 for b, c in zip(blocks, self.config.instance_cache_blocks())]

    # -- snapshots and pickling -----------------------------------------------------------------------
    def snapshot(self):
        """An opaque copy of the episode's state (module docstring, Snapshots)."""
        if self.sim is None:
            raise RuntimeError("snapshot: call reset() first")
        return (self.sim, self.sim.snapshot(), dict(self._last_info), None if self._credit is None else self._credit.copy())

    def restore(self, snapshot) -> np.ndarray:
        """Back to the state of ``snapshot`` (from :meth:`snapshot` during this episode); returns the
        pending decision's observation."""
        if not (isinstance(snapshot, tuple) and len(snapshot) == 4 and snapshot[0] is self.sim):
            raise ValueError("snapshot: expected a snapshot of this env's current episode")
        self.sim.restore(snapshot[1])
        self._last_info = dict(snapshot[2])
        if snapshot[3] is not None:
            self._credit = snapshot[3].copy()
        if self._core is not None:
            self._core.observe()
        return self._observe()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_core"] = None  # the engine's core is rebuilt over the unpickled simulator
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(self.sim, NativeRoutingSimulator) and self._credit is None:
            self._obs, self._mask_buffer, self._info_row = (self._obs.copy(), self._mask_buffer.copy(),
                                                            self._info_row.copy())  # its own, not a vector's rows
            self._start_core()

    def _picture(self) -> str:
        """The text picture of the current state (``render_mode="ansi"``)."""
        v = self.sim.view
        now = v.now if v is not None else float("nan")
        lines = [f"t={now:8.2f}s  request {self._request_index()}/{len(self.sim.trace)}"
                 + (f"  input {v.input_tokens} tok, best prefix {v.best_hit_tokens} tok" if v else "  (done)")]
        queues, fills = self._pool(now)
        for i, (q, fill) in enumerate(zip(queues, fills)):
            q = q if v is not None else 0.0
            bar = "#" * min(20, int(q / self.config.ttft_slo_s * 4))
            hit = v.hit_tokens[i] if v is not None else 0
            lines.append(f"  [{i:2d}] queue {q:7.2f}s {bar:<20s} hit {hit:6d} tok  cache {fill:5.0%}")
        if self._last_info:
            li = self._last_info
            lines.append(f"  last: -> {li['instance']}{' (pull)' if li['pull'] else ''} TTFT {li['ttft_s']:.2f}s")
        return "\n".join(lines)
