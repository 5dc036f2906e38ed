"""Vector environments: N environments of one class stepped in one call (docs/engine.md, "Vector
environments").

:class:`BatchedVectorEnv` is a Gymnasium :class:`~gymnasium.vector.VectorEnv` with Gymnasium's
autoreset semantics (``autoreset_mode`` ``NEXT_STEP``, the default, or ``SAME_STEP``): on the
native engine every sub-environment's core writes its observation, action mask and info row into
one row of the vector's buffers, and :meth:`~BatchedVectorEnv.step` steps them all in one call
into the engine (over threads when ``threads`` > 1); a sub-environment running in Python (the
reference engine, an observation mode) is stepped in a loop and its results copied into the same
buffers. ``gym.make_vec("mooncake_gym/PrefillRouting-v0", num_envs=N,
vectorization_mode="vector_entry_point")`` makes one (``PrefillRouting-v1`` and
``OverloadAdmission-v1`` likewise, their episodes on ``ClusterEnvCore``); :class:`SB3VecEnv` is the same for
stable-baselines3 (its ``VecEnv`` API: ``terminal_observation`` and ``TimeLimit.truncated`` in the
infos).

The interface an environment class implements to be batched natively (``PrefillRoutingEnv``
does; any other ``gym.Env`` with a ``Discrete`` action space runs through the Python loop):

- ``NATIVE_INFO``: the info row's fields, ``((name, type), ...)`` with type ``int``, ``bool`` or
  ``float``, in the order the core writes them;
- ``_use_buffers(obs, mask, info)``: the rows (float32 of the observation's size, int8 of the
  action space's ``n``, float64 of ``len(NATIVE_INFO)``) its engine writes into from now on;
- ``_core``: after ``reset``, the engine's core of the episode (a ``mooncake_gym._engine_native``
  ``SteppableEnv``, C++ ``batch.hpp``), or None when the episode runs in Python;
- ``_end_info()``: the entries its info adds when an episode ends (``metrics``);
- ``_mask_buffer``: its action mask (the row it was given).

Infos follow Gymnasium's vector convention (a value per env and a ``_name`` mask of the envs that
have it), except ``action_mask``, which is one ``(N, n)`` int8 array (every env has one).
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from mooncake_gym import _engine

#: The default ``threads`` (:func:`default_threads`): one thread per this many native envs, at most
#: the cores the process may run on and at most :data:`MAX_THREADS`. On the project's 2-core machine
#: shared with other jobs (load average 2-12, 2026-12-04, docs/engine.md "Measured speed") two
#: threads did not pay: a vector env of 16 made 0.8-1.0x the steps/s of one thread, of 64 0.8-1.1x;
#: the default keeps 16 envs on one thread and threads from 64 envs on, where a free core may pay.
ENVS_PER_THREAD = 32
MAX_THREADS = 8
#: The info fields' types (NATIVE_INFO), in the order of the engine's kinds (batch.hpp InfoKind).
_KINDS = (float, int, bool)


def default_threads(num_envs: int) -> int:
    """The threads of a native step of ``num_envs`` envs by default: one per :data:`ENVS_PER_THREAD`
    envs, at least 1, at most the cores this process may run on and :data:`MAX_THREADS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (not on Linux)
        cores = os.cpu_count() or 1
    return max(1, min(num_envs // ENVS_PER_THREAD, cores, MAX_THREADS))


class BatchedVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` environments made by ``env_fn()`` (module docstring). ``threads``: threads of a
    native step (None: :func:`default_threads`; 1: the calling thread only); ``max_episode_steps``:
    truncate each episode after that many steps (as gym.make's TimeLimit)."""

    def __init__(self, env_fn, num_envs: int, autoreset_mode=AutoresetMode.NEXT_STEP, threads: int | None = None,
                 max_episode_steps: int | None = None):
        if not (isinstance(num_envs, int) and not isinstance(num_envs, bool) and num_envs >= 1):
            raise ValueError(f"num_envs: expected an integer >= 1, got {num_envs!r}")
        autoreset_mode = AutoresetMode(autoreset_mode)
        if autoreset_mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ValueError(f"autoreset_mode: expected NEXT_STEP or SAME_STEP, got {autoreset_mode}")
        if threads is not None and not (isinstance(threads, int) and threads >= 1):
            raise ValueError(f"threads: expected None or an integer >= 1, got {threads!r}")
        if max_episode_steps is not None and not (isinstance(max_episode_steps, int) and max_episode_steps >= 1):
            raise ValueError(f"max_episode_steps: expected None or an integer >= 1, got {max_episode_steps!r}")
        self.envs = [env_fn() for _ in range(num_envs)]
        first = self.envs[0]
        if not isinstance(first.action_space, gym.spaces.Discrete):
            raise ValueError(f"env_fn: expected environments with a Discrete action space, got {first.action_space}")
        self.num_envs = num_envs
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {**getattr(first, "metadata", {}), "autoreset_mode": autoreset_mode}
        self.render_mode = first.render_mode
        self.autoreset_mode = autoreset_mode
        self.max_episode_steps = max_episode_steps
        n_actions = int(self.single_action_space.n)
        self._fields = getattr(type(first), "NATIVE_INFO", ())
        self._batchable = bool(self._fields) and hasattr(first, "_use_buffers") and _engine.available()
        self._obs = np.zeros((num_envs,) + self.single_observation_space.shape, self.single_observation_space.dtype)
        self._mask = np.ones((num_envs, n_actions), np.int8)
        self._info = np.zeros((num_envs, max(1, len(self._fields))), np.float64)
        self._rewards = np.zeros(num_envs, np.float64)
        self._terminated = np.zeros(num_envs, np.bool_)
        self._truncated = np.zeros(num_envs, np.bool_)
        self._elapsed = np.zeros(num_envs, np.int64)
        self._native = np.zeros(num_envs, np.bool_)  # whose episode has an engine core
        # the info columns: one row per field of each kind's block (float64, int64, bool), so that a
        # step's info values are three copies and a view per field
        kinds = [_KINDS.index(kind) for _, kind in self._fields]
        sizes = [kinds.count(k) for k in range(len(_KINDS))]
        self._blocks = tuple(np.zeros((m, num_envs), dtype) for m, dtype in zip(sizes, (np.float64, np.int64, np.bool_)))
        # (name, block, row of the block) per field, in NATIVE_INFO's order
        self._layout = [(name, k, kinds[:f].count(k)) for f, ((name, _), k) in enumerate(zip(self._fields, kinds))]
        self._batch = _engine.native.EnvBatch(num_envs) if self._batchable else None
        if self._batchable:
            for i, env in enumerate(self.envs):
                env._use_buffers(self._obs[i], self._mask[i], self._info[i])
            self._batch.bind(self._rewards, self._terminated, self._truncated, self._elapsed, max_episode_steps or 0,
                             kinds, *self._blocks)
        self.threads = default_threads(num_envs) if threads is None else threads
        self._n_actions = n_actions
        self._ends: dict = {}  # a Python-stepped env's info entries beyond the row (metrics), this step
        self._shape = (num_envs,)
        self._everyone = np.ones(num_envs, np.bool_)  # (a read-only mask of every env, shared by the infos)
        self._everyone.flags.writeable = False
        self._every_mask = {"_" + name: self._everyone for name, _ in self._fields}
        # a step's infos before its values: the fields (block order), then their masks (every env)
        self._spec = [(name, k, row) for k in range(len(_KINDS)) for name, b, row in self._layout if b == k]
        self._template = {**{name: None for name, _, _ in self._spec}, **self._every_mask}
        self._resets: list[int] = []  # NEXT_STEP: the envs that ended at the last step
        self._all_native = False
        self._field_names = {name for name, _ in self._fields}
        self.closed = False

    # -- episodes --------------------------------------------------------------------------------------
    def _reset_env(self, i: int, seed=None, options=None) -> dict:
        env = self.envs[i]
        obs, info = env.reset(seed=seed, options=options)
        core = getattr(env, "_core", None) if self._batchable else None
        self._native[i] = core is not None
        if self._batch is not None:
            self._batch.set(i, core)
        if core is None:
            self._obs[i] = obs
            if "action_mask" in info:
                self._mask[i] = info["action_mask"]
        self._elapsed[i] = 0
        info = dict(info)
        info.pop("action_mask", None)  # in the vector's (N, n) action_mask
        return info

    def reset(self, *, seed: int | list | None = None, options: dict | None = None):
        if seed is None:
            seeds = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"seed: expected None, an integer or {self.num_envs} seeds, got {len(seeds)}")
        infos: dict = {}
        for i, s in enumerate(seeds):
            infos = self._add_info(infos, self._reset_env(i, s, options), i)
        self._resets = []
        self._all_native = bool(self._native.all())
        infos["action_mask"], infos["_action_mask"] = self._mask.copy(), self._everyone
        return self._obs.copy(), infos

    def _actions(self, actions) -> np.ndarray:
        a = np.asarray(actions)
        if a.shape != (self.num_envs,) or a.dtype.kind not in "iu":
            raise ValueError(f"actions: expected {self.num_envs} integers, got {a!r}")
        return np.ascontiguousarray(a, dtype=np.int64)

    def step(self, actions):
        a = actions
        if not (type(a) is np.ndarray and a.dtype == np.int64 and a.shape == self._shape and a.flags.c_contiguous):
            a = self._actions(actions)
        self._ends = {}
        if self._resets or not self._all_native:
            return self._step_mixed(a)
        # every env native, none starting an episode: one engine call, the infos' columns
        ended = self._batch.step(a, None, self.threads)
        infos = self._columns(self._template.copy())
        if ended:
            infos = self._end_episodes(infos, self._everyone)
        infos["action_mask"], infos["_action_mask"] = self._mask.copy(), self._everyone
        return self._obs.copy(), self._rewards.copy(), self._terminated.copy(), self._truncated.copy(), infos

    def _step_mixed(self, a: np.ndarray):
        """:meth:`step` where envs start an episode (``NEXT_STEP``: those that ended at the last
        step) or run in Python: the native rest in one engine call, the Python ones one at a time."""
        rewards, terminated, truncated = self._rewards, self._terminated, self._truncated
        resets, self._resets = self._resets, []
        stepped = np.ones(self.num_envs, np.bool_)
        stepped[resets] = False
        native = stepped & self._native
        python = np.flatnonzero(stepped & ~self._native)
        if python.size and (a[python].min() < 0 or a[python].max() >= self._n_actions):
            raise ValueError(f"actions: expected integers in 0..{self._n_actions - 1}, got {a!r}")
        for block in self._blocks:
            block[:, resets] = 0
        started: list = []  # (env, its reset's info) of the envs starting an episode
        if self._batch is not None and native.any():
            if resets and self.threads > 1:  # the engine steps the others on its threads meanwhile
                self._batch.launch(a, native, self.threads)
                try:
                    started = [(i, self._reset_env(i)) for i in resets]
                finally:
                    self._batch.finish()
            else:
                self._batch.step(a, native, self.threads)
        for i in python:  # episodes in Python: one env at a time
            obs, r, term, _, info = self.envs[i].step(int(a[i]))
            self._obs[i] = obs
            rewards[i], terminated[i] = r, term
            self._elapsed[i] += 1
            truncated[i] = self.max_episode_steps is not None and self._elapsed[i] >= self.max_episode_steps and not term
            self._copy_python_info(i, info)
        stepped.flags.writeable = False
        infos: dict = {}
        if stepped.any():
            infos = self._columns({})
            infos.update(dict.fromkeys(self._every_mask, stepped))
        if ((terminated | truncated) & stepped).any():
            infos = self._end_episodes(infos, stepped)
        if not started:
            started = [(i, self._reset_env(i)) for i in resets]
        for i, info in started:  # NEXT_STEP: the envs that ended at the last step start their next episode
            infos = self._add_info(infos, info, i)
            rewards[i], terminated[i], truncated[i] = 0.0, False, False
        if resets:
            self._all_native = bool(self._native.all())
        infos["action_mask"], infos["_action_mask"] = self._mask.copy(), self._everyone
        return self._obs.copy(), rewards.copy(), terminated.copy(), truncated.copy(), infos

    def _columns(self, infos: dict) -> dict:
        """``infos`` with this step's info columns, new arrays: each kind's block copied once, then
        its rows (indexing a row is cheaper than iterating the block or copying each row)."""
        blocks = (self._blocks[0].copy(), self._blocks[1].copy(), self._blocks[2].copy())
        for name, k, row in self._spec:
            infos[name] = blocks[k][row]
        return infos

    def _end_episodes(self, infos: dict, stepped: np.ndarray) -> dict:
        """The entries of the envs whose episode ended at this step (``metrics``), and their
        autoreset: ``NEXT_STEP`` at the next step, ``SAME_STEP`` now (the final observation and
        info, then the next episode's first)."""
        ended = np.flatnonzero((self._terminated | self._truncated) & stepped)
        for i in ended:
            infos = self._add_info(infos, self.envs[i]._end_info() if self._native[i] else self._ends.get(i, {}), i)
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            self._resets = ended.tolist()
            return infos
        for i in ended:
            final = {"final_obs": self._obs[i].copy(), "final_info": self.single_info(infos, i)}
            infos = self._add_info(infos, final, i)
            infos = self._add_info(infos, self._reset_env(i), i)
        self._all_native = bool(self._native.all())
        return infos

    def _copy_python_info(self, i: int, info: dict) -> None:
        """A Python-stepped env's info into the buffers (its columns, its mask; the end entries kept).
        A float field the info leaves out (the v1 envs' ``ttft_s`` of a rejected request) reads NaN,
        as the engine's row has it."""
        for name, k, row in self._layout:
            self._blocks[k][row, i] = info[name] if k or name in info else np.nan
        if "action_mask" in info:
            self._mask[i] = info["action_mask"]
        end = {k: v for k, v in info.items() if k != "action_mask" and k not in self._field_names}
        if end:
            self._ends[i] = end

    def single_info(self, infos: dict, i: int) -> dict:
        """Env ``i``'s entries of vector ``infos`` as the single env's info dict (its types)."""
        out = {}
        for key, value in infos.items():
            if key.startswith("_") or key in ("final_obs", "final_info"):
                continue
            if key == "action_mask":
                out[key] = value[i].copy()
            elif isinstance(value, dict):
                if infos.get("_" + key, np.zeros(self.num_envs, bool))[i]:
                    out[key] = self.single_info(value, i)
            elif infos.get("_" + key, np.zeros(self.num_envs, bool))[i]:
                v = value[i]
                out[key] = v.item() if isinstance(v, np.generic) else v
        return out

    # -- the rest of the API ---------------------------------------------------------------------------
    def action_masks(self) -> np.ndarray:
        """Every env's action mask of its pending decision, ``(num_envs, n)`` bool."""
        return self._mask.astype(bool)

    def render(self):
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs):
        for env in self.envs:
            env.close()


def make_routing_vector(num_envs: int, autoreset_mode=AutoresetMode.NEXT_STEP, threads: int | None = None,
                        max_episode_steps: int | None = None, **kwargs) -> BatchedVectorEnv:
    """``PrefillRouting-v0``'s vector entry point: ``num_envs`` envs of the same ``kwargs``."""
    from mooncake_gym.envs.prefill_routing import PrefillRoutingEnv

    return BatchedVectorEnv(lambda: PrefillRoutingEnv(**kwargs), num_envs, autoreset_mode, threads, max_episode_steps)


def make_routing_v1_vector(num_envs: int, autoreset_mode=AutoresetMode.NEXT_STEP, threads: int | None = None,
                           max_episode_steps: int | None = None, **kwargs) -> BatchedVectorEnv:
    """``PrefillRouting-v1``'s vector entry point: ``num_envs`` envs of the same ``kwargs``, each a
    ``ClusterEnvCore`` on the native engine (``_engine/clusterenv.hpp``)."""
    from mooncake_gym.envs.prefill_routing_v1 import PrefillRoutingV1Env

    return BatchedVectorEnv(lambda: PrefillRoutingV1Env(**kwargs), num_envs, autoreset_mode, threads, max_episode_steps)


def make_admission_v1_vector(num_envs: int, autoreset_mode=AutoresetMode.NEXT_STEP, threads: int | None = None,
                             max_episode_steps: int | None = None, **kwargs) -> BatchedVectorEnv:
    """``OverloadAdmission-v1``'s vector entry point, as :func:`make_routing_v1_vector`."""
    from mooncake_gym.envs.overload_admission_v1 import OverloadAdmissionV1Env

    return BatchedVectorEnv(lambda: OverloadAdmissionV1Env(**kwargs), num_envs, autoreset_mode, threads,
                            max_episode_steps)


try:  # stable-baselines3 is a dependency of the package; the class is defined only where it imports
    from stable_baselines3.common.vec_env import VecEnv as _SB3VecEnv
except ImportError:  # pragma: no cover
    _SB3VecEnv = None


if _SB3VecEnv is not None:
    class SB3VecEnv(_SB3VecEnv):
        """A :class:`BatchedVectorEnv` (``SAME_STEP`` autoreset) as stable-baselines3's ``VecEnv``:
        ``SB3VecEnv(lambda: gym.make(...).unwrapped, n)``, ``SB3VecEnv.routing(n, **kwargs)`` or
        ``SB3VecEnv.routing_v1(n, **kwargs)``;
        each ended episode's last observation is ``infos[i]["terminal_observation"]``, and
        ``infos[i]["TimeLimit.truncated"]`` says whether it was truncated."""

        def __init__(self, env_fn, num_envs: int, threads: int | None = None, max_episode_steps: int | None = None):
            self.venv = BatchedVectorEnv(env_fn, num_envs, AutoresetMode.SAME_STEP, threads, max_episode_steps)
            super().__init__(num_envs, self.venv.single_observation_space, self.venv.single_action_space)
            self._actions = None

        @classmethod
        def routing(cls, num_envs: int, threads: int | None = None, **kwargs) -> "SB3VecEnv":
            """``num_envs`` ``PrefillRouting-v0`` envs of the same ``kwargs``."""
            from mooncake_gym.envs.prefill_routing import PrefillRoutingEnv

            return cls(lambda: PrefillRoutingEnv(**kwargs), num_envs, threads)

        @classmethod
        def routing_v1(cls, num_envs: int, threads: int | None = None, **kwargs) -> "SB3VecEnv":
            """``num_envs`` ``PrefillRouting-v1`` envs of the same ``kwargs``."""
            from mooncake_gym.envs.prefill_routing_v1 import PrefillRoutingV1Env

            return cls(lambda: PrefillRoutingV1Env(**kwargs), num_envs, threads)

        def reset(self):
            seeds = [None if s is None else int(s) for s in self._seeds]
            if all(s is None for s in seeds):
                seeds = None
            options = self._options[0] if self._options and all(o == self._options[0] for o in self._options) else None
            obs, infos = self.venv.reset(seed=seeds, options=options or None)
            self.reset_infos = [self.venv.single_info(infos, i) for i in range(self.num_envs)]
            self._reset_seeds()
            self._reset_options()
            return obs

        def step_async(self, actions) -> None:
            self._actions = np.asarray(actions).reshape(self.num_envs)

        def step_wait(self):
            obs, rewards, terminated, truncated, infos = self.venv.step(self._actions.astype(np.int64))
            done = terminated | truncated
            out = [{} for _ in range(self.num_envs)]
            for i in np.flatnonzero(done):
                out[i] = self.venv.single_info(infos["final_info"], i)
                out[i]["terminal_observation"] = infos["final_obs"][i]
                out[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            return obs, rewards.astype(np.float32), done, out

        def action_masks(self) -> np.ndarray:
            return self.venv.action_masks()

        def close(self) -> None:
            self.venv.close()

        def get_attr(self, attr_name, indices=None):
            return [getattr(self.venv.envs[i], attr_name) for i in self._get_indices(indices)]

        def set_attr(self, attr_name, value, indices=None) -> None:
            for i in self._get_indices(indices):
                setattr(self.venv.envs[i], attr_name, value)

        def env_method(self, method_name, *method_args, indices=None, **method_kwargs):
            return [getattr(self.venv.envs[i], method_name)(*method_args, **method_kwargs)
                    for i in self._get_indices(indices)]

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [isinstance(self.venv.envs[i], wrapper_class) for i in self._get_indices(indices)]

        def get_images(self):
            return [env.render() for env in self.venv.envs]
