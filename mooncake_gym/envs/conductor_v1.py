"""``mooncake_gym/Conductor-v1``: one agent makes all three of Mooncake's Conductor decisions."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from mooncake_gym.sim.cluster import ClusterAction
from mooncake_gym.sim.routing import Route
from mooncake_gym.model.prediction import DEFAULT_PREDICTION_SIGMA
from mooncake_gym.envs.cluster import (ARGUMENTS_DOC, DEFAULT_WASTE_PENALTY, GOODPUT_REWARD_DOC, SPEED_DOC,
                                       WORKLOAD_ARGUMENTS_DOC, ClusterEnv, shared_sections)
from mooncake_gym.envs.common import INTEGER_TYPES

_REJECT = ClusterAction(False, None, None)


class ConductorV1Env(ClusterEnv):
    __doc__ = f"""
    ## Description

    Mooncake's Conductor (arXiv 2407.00079, §5-§7, Algorithm 1) as one agent: at every arriving
    request it decides admission, the prefill instance (and whether to pull the best cached prefix
    there) and the decode instance, in a disaggregated cluster of a preset (default ``mooncake``: 8
    prefill + 8 decode nodes of 8x A800 serving LLaMA2-70B, TTFT SLO 30 s, TBT SLO 100 ms). The
    chosen decode instance double-checks at the prefill's end (room for the KV, iteration time
    within the TBT SLO) and rejects the request after prefill if it fails, wasting the prefill. The
    simulation is ``mooncake_gym.sim.cluster.ClusterSimulator``; ``PrefillRouting-v1`` and
    ``OverloadAdmission-v1`` are this environment with two of the decisions left to its defaults.

    ## Action Space

    ``MultiDiscrete([2, P, 2, D + 1])``, P / D = the preset's prefill / decode instances: (admit,
    prefill instance, pull, decode instance). ``admit`` 0 rejects the request at arrival (the other
    three are then ignored), 1 admits it; ``pull`` 1 pulls the best prefix to the prefill instance
    first (nothing where it holds it already); decode instance ``D`` (the last value) means "the
    default rule at the prefill's end" (the shortest predicted iteration time among the instances
    that accept the request), ``j < D`` asks instance ``j``. An action not of shape (4,) or outside
    the space raises ``ValueError``.


    ## Action Masks

    ``action_masks()`` (the protocol of sb3-contrib's ``MaskablePPO`` for a ``MultiDiscrete`` space)
    returns one bool array of ``2 + P + 2 + (D + 1)`` entries, the four dimensions' masks one after
    the other, and the info of every ``reset`` and ``step`` carries the same as
    ``info["action_mask"]`` (int8), both for the decision the returned observation describes. The
    masks are per dimension (MaskablePPO masks each dimension on its own), so a value is masked only
    when it never does anything different: ``pull`` 1 is masked when no prefill instance's prefix
    hit, as the agent sees it, is shorter than the longest prefix anywhere (a pull then copies
    nothing wherever it goes, and is exactly ``pull`` 0); every admit value, prefill instance and
    decode instance is a real choice and stays unmasked (a request too long for a decode instance
    is refused at arrival, before any decision). Masked values stay legal: taken anyway, a masked
    pull acts as no pull.

{shared_sections(GOODPUT_REWARD_DOC)}

    ## Arguments

    ``gym.make("mooncake_gym/Conductor-v1", preset="mooncake", load=None, load_range=None,
    base_trace=None, trace=None, speed=1.0, episode_requests=1000, oracle=False, waste_penalty=0.1,
    render_mode=None, prediction=False, prediction_sigma=0.5,
    observation=None, fresh_blocks=False, engine=None, arrivals=None, window_requests=None)``.
    With neither ``load`` nor ``load_range`` the load is 1.5.
{ARGUMENTS_DOC}

{WORKLOAD_ARGUMENTS_DOC}

    ## Speed

{SPEED_DOC}

    ## Version History

    * 2026-12-05: ``arrivals=`` and ``window_requests=`` (as ``PrefillRouting-v1``'s, issue 26); the
      defaults' episodes are unchanged.
    * v1: initial version (before its first release, issue 13: the reward and the primary metric
      became token goodput within both SLOs without the drain, and ``prediction=True`` was added;
      issue 27: ``action_masks()`` and ``info["action_mask"]``, the observations and rewards unchanged).
      Issue 25 (2026-12-04): ``engine=``; on a cluster the native engine runs, the episodes run on
      it by default (``ClusterEnvCore``), with the same numbers.
    """

    KIND = "conductor"

    def __init__(self, preset="mooncake", load=None, load_range=None, base_trace=None, trace=None,
                 speed: float = 1.0, episode_requests: int = 1000, oracle: bool = False,
                 waste_penalty: float = DEFAULT_WASTE_PENALTY, render_mode=None, prediction: bool = False,
                 prediction_sigma: float = DEFAULT_PREDICTION_SIGMA, observation=None, fresh_blocks: bool = False,
                 engine=None, arrivals=None, window_requests=None):
        super().__init__(preset, load, load_range, 1.5, base_trace, trace, speed, episode_requests, oracle,
                         waste_penalty, render_mode, prediction, prediction_sigma, observation, fresh_blocks, engine,
                         arrivals, window_requests)
        p = self.preset
        self.action_space = spaces.MultiDiscrete([2, p.n_prefill, 2, p.n_decode + 1])
        self._nvec = (2, p.n_prefill, 2, p.n_decode + 1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        info["action_mask"] = self._mask()
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        info["action_mask"] = self._mask()
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """The four dimensions' masks of the pending decision, concatenated (sb3-contrib
        ``MaskablePPO``'s protocol for ``MultiDiscrete``): bool, ``2 + P + 2 + (D + 1)`` long; only a
        pull that copies nothing anywhere is masked (see the class's Action Masks)."""
        return self._mask().astype(bool)

    def _n_mask(self) -> int:
        return 2 + self.preset.n_prefill + 2 + self.preset.n_decode + 1

    def _mask(self) -> np.ndarray:
        if self._core is not None:
            return self._mask_buffer.copy()
        _, n_prefill, _, n_decode = self._nvec
        v = self.decision_view()
        pull = 1 if v is None else int(any(h < v.routing.best_hit_tokens for h in v.routing.hit_tokens))
        return np.array([1, 1] + [1] * n_prefill + [1, pull] + [1] * n_decode, np.int8)

    def encode_action(self, action) -> np.ndarray:
        """The env action of a :class:`ClusterAction` (a route None is not expressible: give one), or
        of an admission policy's bool (admit on the default route, the default decode rule), so that
        the admission baselines run here too."""
        if isinstance(action, (bool, np.bool_)):
            action = ClusterAction(bool(action), self.sim.view.default_route if action else None, None)
        if not action.admit:
            return np.array([0, 0, 0, self._nvec[3] - 1], np.int64)
        inst, pull = action.route if isinstance(action.route, tuple) else (action.route, False)
        decode = self._nvec[3] - 1 if action.decode is None else action.decode
        return np.array([1, int(inst), int(pull), decode], np.int64)

    def _action(self, action) -> ClusterAction:
        a = self._parse(action)
        if not a[0]:
            return _REJECT
        return ClusterAction(True, Route(a[1], a[2] == 1), None if a[3] == self._nvec[3] - 1 else a[3])

    def _step_core(self, core, action) -> tuple:
        a = self._parse(action)
        return core.act(a[0] == 1, a[1], a[2] == 1, a[3])

    def _parse(self, action) -> list:
        """The four integers of ``action``, checked against the space (``ValueError`` otherwise)."""
        # an integer array of shape (4,) (what the space samples and SB3 gives), or a list or
        # tuple of four integers; nothing else (as MultiDiscrete.contains: no floats, no strings)
        a = None
        if type(action) is np.ndarray:
            if action.shape == (4,) and action.dtype.kind in "iu":
                a = action.tolist()
        elif isinstance(action, (list, tuple)) and len(action) == 4 and all(type(x) in INTEGER_TYPES for x in action):
            a = [int(x) for x in action]
        nvec = self._nvec
        if a is None or not (0 <= a[0] < 2 and 0 <= a[1] < nvec[1] and 0 <= a[2] < 2 and 0 <= a[3] < nvec[3]):
            raise ValueError(f"action: expected 4 integers (admit 0..1, prefill instance 0..{self._nvec[1] - 1}, "
                             f"pull 0..1, decode instance 0..{self._nvec[3] - 1}), got {action!r}")
        return a

    def _reward(self, info: dict) -> float:
        return self.goodput_reward(info)
