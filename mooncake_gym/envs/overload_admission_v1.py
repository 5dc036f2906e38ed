"""``mooncake_gym/OverloadAdmission-v1``: admission control of the whole cluster under overload."""

from __future__ import annotations

from gymnasium import spaces

from mooncake_gym.sim.cluster import ClusterAction
from mooncake_gym.model.prediction import DEFAULT_PREDICTION_SIGMA
from mooncake_gym.envs.cluster import (ARGUMENTS_DOC, DEFAULT_WASTE_PENALTY, GOODPUT_REWARD_DOC, SPEED_DOC,
                                       WORKLOAD_ARGUMENTS_DOC, ClusterEnv, shared_sections)
from mooncake_gym.envs.common import INTEGER_TYPES, in_space

_ACTIONS = (ClusterAction(False, None, None), ClusterAction(True, None, None))


class OverloadAdmissionV1Env(ClusterEnv):
    __doc__ = f"""
    ## Description

    A disaggregated cluster (Mooncake, arXiv 2407.00079, §7) of a preset (default
    ``mooncake-overload``: 16 prefill + 1 decode nodes of 8x A800 serving LLaMA2-70B, so that the
    decode pool saturates first, as in Mooncake §7; on ``mooncake`` the prefill pool saturates
    first) receives more requests than it can serve. One step is one arriving request, and the
    agent admits or rejects it. An admitted request is prefilled where the default router
    (Algorithm 1, ``kvcentric``) sends it; at the prefill's end the default rule picks the decode
    instance with the shortest predicted iteration time among those with room for its KV and an
    iteration time within the TBT SLO; if none accepts, it is rejected after prefill and its
    prefill is wasted. A decode instance that runs out of KV memory preempts requests (their prefill
    is wasted too). The simulation is ``mooncake_gym.sim.cluster.ClusterSimulator``.

    ## Action Space

    ``Discrete(2)``: 0 = reject at arrival, 1 = admit. Both are legal at every step; an action
    outside the space (or not an integer) raises ``ValueError``.

{shared_sections(GOODPUT_REWARD_DOC)}

    ## Arguments

    ``gym.make("mooncake_gym/OverloadAdmission-v1", preset="mooncake-overload", load=None,
    load_range=None, base_trace=None, trace=None, speed=1.0, episode_requests=1000, oracle=False,
    waste_penalty=0.1, render_mode=None, prediction=False, prediction_sigma=0.5,
    observation=None, fresh_blocks=False, engine=None, arrivals=None, window_requests=None)``.
    With neither ``load`` nor ``load_range`` the load is 2.
{ARGUMENTS_DOC}

{WORKLOAD_ARGUMENTS_DOC}

    ## Speed

{SPEED_DOC}

    ## Version History

    * 2026-12-05: ``arrivals=`` and ``window_requests=`` (as ``PrefillRouting-v1``'s, issue 26); the
      defaults' episodes are unchanged.
    * v1: the whole cluster (``cluster.ClusterSimulator``: continuous-batching decode, TBT SLO,
      KV transfer, preemption) on ``mooncake-overload``; the observation adds the prefill pool
      per instance and the decode pool per instance; the reward counts output tokens; load as a
      multiple of the measured saturation throughput. Before its first release (issue 13) the
      reward and the primary metric became token goodput within both SLOs without the drain,
      and ``prediction=True`` was added.
      Issue 25 (2026-12-04): ``engine=``; on a cluster the native engine runs, the episodes run on
      it by default (``ClusterEnvCore``), with the same numbers.
    * v0: the lecture's overload model (still registered, unchanged).
    """

    KIND = "admission"

    def __init__(self, preset="mooncake-overload", load=None, load_range=None, base_trace=None, trace=None,
                 speed: float = 1.0, episode_requests: int = 1000, oracle: bool = False,
                 waste_penalty: float = DEFAULT_WASTE_PENALTY, render_mode=None, prediction: bool = False,
                 prediction_sigma: float = DEFAULT_PREDICTION_SIGMA, observation=None, fresh_blocks: bool = False,
                 engine=None, arrivals=None, window_requests=None):
        super().__init__(preset, load, load_range, 2.0, base_trace, trace, speed, episode_requests, oracle,
                         waste_penalty, render_mode, prediction, prediction_sigma, observation, fresh_blocks, engine,
                         arrivals, window_requests)
        self.action_space = spaces.Discrete(2)

    def encode_action(self, admit) -> int:
        return 1 if admit else 0

    def _action(self, action) -> ClusterAction:
        if (action == 0 or action == 1) if type(action) in INTEGER_TYPES else in_space(self.action_space, action):
            return _ACTIONS[int(action)]
        raise ValueError(f"action: expected 0 (reject) or 1 (admit), got {action!r}")

    def _n_mask(self) -> int:
        return 2

    def _step_core(self, core, action) -> tuple:
        if (action == 0 or action == 1) if type(action) in INTEGER_TYPES else in_space(self.action_space, action):
            return core.step(int(action))
        raise ValueError(f"action: expected 0 (reject) or 1 (admit), got {action!r}")

    def _reward(self, info: dict) -> float:
        return self.goodput_reward(info)
