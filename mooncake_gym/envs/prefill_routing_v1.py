"""``mooncake_gym/PrefillRouting-v1``: prefill routing in the whole disaggregated cluster."""

from __future__ import annotations

from gymnasium import spaces

from mooncake_gym.sim.cluster import ClusterAction
from mooncake_gym.sim.routing import Route
from mooncake_gym.envs.cluster import ARGUMENTS_DOC, SPEED_DOC, WORKLOAD_ARGUMENTS_DOC, ClusterEnv, shared_sections
from mooncake_gym.envs.common import INTEGER_TYPES, in_space


TTFT_REWARD_DOC = """\
    ``-TTFT / SLO`` of the request just routed (its TTFT is known at the decision: the prefill
    instances are FIFO and deterministic), as in v0: the return is minus the episode's total TTFT
    in SLO units. What the routing does to the decode side shows only in ``info["metrics"]`` at the
    end (TBT, goodput)."""


class PrefillRoutingV1Env(ClusterEnv):
    __doc__ = f"""
    ## Description

    ``PrefillRouting-v0``'s problem in a whole disaggregated cluster (Mooncake, arXiv 2407.00079,
    §5-§6) of a preset (default ``mooncake``: 8 prefill + 8 decode nodes of 8x A800 serving
    LLaMA2-70B, chunked prefill, continuous-batching decode, TTFT SLO 30 s, TBT SLO 100 ms). One
    step is one arriving request: the agent picks the prefill instance and whether to first pull
    the longest prefix cached anywhere over RDMA. Every request is admitted (no TTFT check at
    arrival); the decode instance is chosen at the prefill's end by the simulator's default rule
    (the shortest predicted iteration time among the instances that accept it), and a decode
    instance without room rejects the request after its prefill. Requests whose prompt plus output
    can never fit one decode instance are refused at arrival without a step. The simulation is
    ``mooncake_gym.sim.cluster.ClusterSimulator``, the same object that runs the hand-coded policies
    (``cluster.simulate``).

    ## Action Space

    ``Discrete(2 * P)``, P = the preset's prefill instances: ``a < P`` prefills on instance ``a``;
    ``a >= P`` on instance ``a - P`` after pulling the best prefix there (a pull where the instance
    holds the best prefix already does nothing), as in v0. An action outside the space (or not an
    integer) raises ``ValueError``.

{shared_sections(TTFT_REWARD_DOC)}

    ## Arguments

    ``gym.make("mooncake_gym/PrefillRouting-v1", preset="mooncake", load=None, load_range=None,
    base_trace=None, trace=None, speed=1.0, episode_requests=1000, oracle=False, render_mode=None,
    observation=None, fresh_blocks=False, engine=None, arrivals=None, window_requests=None)``.
    With neither ``load`` nor ``load_range`` the load is 0.9.
{ARGUMENTS_DOC}

{WORKLOAD_ARGUMENTS_DOC}

    ## Speed

{SPEED_DOC}

    ## Version History

    * 2026-12-04: ``arrivals=`` (bursty or diurnal arrivals) and ``window_requests=`` (a window of a
      replayed trace per episode); the defaults' episodes are unchanged.
    * v1: the whole cluster (``cluster.ClusterSimulator``) on the ``mooncake`` preset; the
      observation adds the decode pool and Algorithm 1's TTFT prediction; workloads by load.
      Issue 25 (2026-12-04): ``engine=``; on a cluster the native engine runs, the episodes run on
      it by default (``ClusterEnvCore``), with the same numbers.
    * v0: prefill pool alone, ``lecture`` cost model (still registered, unchanged).
    """

    KIND = "routing"

    def __init__(self, preset="mooncake", load=None, load_range=None, base_trace=None, trace=None,
                 speed: float = 1.0, episode_requests: int = 1000, oracle: bool = False, render_mode=None,
                 observation=None, fresh_blocks: bool = False, engine=None, arrivals=None, window_requests=None):
        super().__init__(preset, load, load_range, 0.9, base_trace, trace, speed, episode_requests, oracle,
                         render_mode=render_mode, observation=observation, fresh_blocks=fresh_blocks, engine=engine,
                         arrivals=arrivals, window_requests=window_requests)
        n = self.preset.n_prefill
        self.action_space = spaces.Discrete(2 * n)
        self._n = n
        self._routes = [ClusterAction(True, Route(a % n, a >= n), None) for a in range(2 * n)]

    def encode_action(self, route) -> int:
        """The env action for a routing policy's answer (an instance or a ``Route``)."""
        inst, pull = route if isinstance(route, tuple) else (route, False)
        return int(inst) + (self._n if pull else 0)

    def _action(self, action) -> ClusterAction:
        if (type(action) in INTEGER_TYPES and 0 <= action < 2 * self._n) or in_space(self.action_space, action):
            return self._routes[int(action)]
        raise ValueError(f"action: expected an integer in 0..{2 * self._n - 1}, got {action!r}")

    def _step_core(self, core, action) -> tuple:
        if type(action) in INTEGER_TYPES and 0 <= action < 2 * self._n:
            return core.step(int(action))
        self._action(action)  # raises outside the space
        return core.step(int(action))

    def _reward(self, info: dict) -> float:
        return -info["ttft_s"] / self.preset.ttft_slo_s
