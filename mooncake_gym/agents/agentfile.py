"""The agent file format: an SB3 zip and a JSON card that says everything needed to act.

An agent is what a policy needs to act on an environment:

* the SB3 model (PPO, A2C, DQN, or sb3-contrib's RecurrentPPO and MaskablePPO), saved by SB3's
  ``model.save`` as ``NAME.zip``;
* the card ``NAME.json`` beside it: the env id, the algorithm, the policy class (an allow-listed
  name), the network's architecture (``net_arch``, activation, LSTM sizes...), the observation and
  action spaces, the observation normalisation of ``VecNormalize`` as plain numbers (mean,
  variance, clip, epsilon), the observation wrappers it was trained behind (import path and JSON
  keyword arguments), and the zip's sha256.

A card may also say where ``compare`` shows the agent, ``scenarios``: a list of scenario names (a
per-scenario agent: only in those scenarios' tables, not on ``compare --preset``'s settings), an
empty list (a tutorial agent: on ``compare --preset``'s settings and in no scenario's table, so not
on the leaderboard; ``ppo_routing``), or no ``scenarios`` (everywhere its spaces fit;
:func:`mooncake_gym.experiments.compare.agent_scenarios`); and, for people, ``notes``, ``trained_on``,
``never_saw`` and ``evaluation``.

Loading never unpickles (:func:`load`): the policy is built from the card's architecture and
spaces, and its weights are read from the zip's ``policy.pth`` with
``torch.load(weights_only=True)``, which accepts tensors only. SB3's own ``data`` member, which
holds pickled objects, is never read. Anything that cannot be loaded this way (a zip without a
card, a custom network) is refused unless the caller passes ``trusted=True`` (CLI
``--unsafe-pickle``), which loads it with SB3's ``load`` and so runs whatever its pickles hold.
Wrapper classes are resolved without importing arbitrary modules: a class from ``mooncake_gym`` or
``gymnasium``, or from a module the caller has already imported (your own wrapper module: import
it first); other modules are imported only with ``trusted=True``. The class must be a
``gymnasium.Wrapper``, and of gymnasium's and SB3's own wrappers only observation wrappers are
accepted (the others record videos or write files where their keyword arguments say).

:class:`Agent` is the loaded object; :func:`as_agent` turns any SB3 model into one (picking up a
``VecNormalize`` the model was trained in), and :func:`save_agent` writes one.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import io
import json
import math
import os
import sys
import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mooncake_gym._files import check_input_file, write_atomic
from mooncake_gym._moved import current_name
from mooncake_gym.model.limits import MAX_AGENT_ACTIONS, MAX_AGENT_OBSERVATION, MAX_AGENT_PARAMETERS

FORMAT = "mooncake-gym-agent/1"
#: Algorithm name (as in the card) -> (module, class). The lower-case names are the CLI's --algo.
ALGORITHMS = {"PPO": ("stable_baselines3", "PPO"), "A2C": ("stable_baselines3", "A2C"),
              "DQN": ("stable_baselines3", "DQN"), "RecurrentPPO": ("sb3_contrib", "RecurrentPPO"),
              "MaskablePPO": ("sb3_contrib", "MaskablePPO")}
ALGO_NAMES = {name.lower(): name for name in ALGORITHMS}
#: The policy class names a card may name, per algorithm (vector observations only).
POLICIES = {name: ("MlpLstmPolicy" if name == "RecurrentPPO" else "MlpPolicy") for name in ALGORITHMS}
#: Activation functions a card may name (torch.nn classes without parameters).
ACTIVATIONS = ("Tanh", "ReLU", "ELU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Identity", "Softplus")
#: Architecture keys a card may carry and the type each must have.
ARCHITECTURE_KEYS = {"net_arch": (list, dict), "activation_fn": str, "ortho_init": bool, "normalize_images": bool,
                     "share_features_extractor": bool, "lstm_hidden_size": int, "n_lstm_layers": int,
                     "shared_lstm": bool, "enable_critic_lstm": bool}
#: Modules whose wrapper classes may be imported on demand without ``trusted``.
SAFE_WRAPPER_PACKAGES = ("mooncake_gym", "gymnasium")
#: Libraries whose non-observation wrappers (video recorders, monitors writing files) a card may not name.
LIBRARY_PACKAGES = ("gymnasium", "stable_baselines3", "sb3_contrib")
CONTRIB_HINT = "pip install 'mooncake-gym[contrib]'"


def sha256_of(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, in hex (the card's ``sha256`` of its zip)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class AgentFormatError(ValueError):
    """An agent file or card that cannot be loaded safely, or that does not fit an environment."""


def algorithm_class(name: str):
    """The SB3 class of an algorithm name ('PPO' or 'ppo', ...); a one-line error if it needs a
    package that is not installed."""
    canonical = ALGO_NAMES.get(str(name).lower())
    if canonical is None:
        raise AgentFormatError(f"algorithm: expected one of {sorted(ALGO_NAMES)}, got {name!r}")
    module, cls = ALGORITHMS[canonical]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError:
        raise AgentFormatError(f"algorithm: {canonical} needs sb3-contrib, which is not installed: {CONTRIB_HINT}") from None


# --- spaces ------------------------------------------------------------------------------------

def space_to_json(space) -> dict:
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return {"type": "MultiDiscrete", "nvec": [int(n) for n in space.nvec]}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": space.low.ravel().tolist(), "high": space.high.ravel().tolist()}
    raise AgentFormatError(f"agent: the format stores Box observations and Discrete or MultiDiscrete actions, "
                           f"not {space}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def space_from_json(d: Any, what: str):
    """The space a card describes; every size checked (:data:`MAX_AGENT_OBSERVATION` entries,
    :data:`MAX_AGENT_ACTIONS` actions) before an array is made."""
    from gymnasium import spaces

    try:
        if not isinstance(d, dict):
            raise TypeError(f"a JSON object expected, got {type(d).__name__}")
        if d["type"] == "Discrete":
            if not (_is_int(d["n"]) and 0 < d["n"] <= MAX_AGENT_ACTIONS and _is_int(d["start"])):
                raise ValueError(f"n must be an integer in 1..{MAX_AGENT_ACTIONS} and start an integer")
            if d["start"] != 0:  # SB3's policies answer 0..n-1 whatever the space's start
                raise ValueError(f"start must be 0 (SB3's policies act on 0..n-1), got {d['start']}")
            return spaces.Discrete(d["n"], start=d["start"])
        if d["type"] == "MultiDiscrete":  # Conductor-v1's actions: one Discrete per decision
            nvec = d["nvec"]
            if not (isinstance(nvec, list) and 0 < len(nvec) <= 64 and all(_is_int(n) and n > 0 for n in nvec)
                    and sum(nvec) <= MAX_AGENT_ACTIONS):
                raise ValueError(f"nvec must list 1 to 64 positive integers of sum at most {MAX_AGENT_ACTIONS}")
            return spaces.MultiDiscrete(nvec)
        if d["type"] == "Box":
            shape = d["shape"]
            if not (isinstance(shape, list) and 0 < len(shape) <= 8 and all(_is_int(x) and x > 0 for x in shape)):
                raise ValueError("shape must list 1 to 8 positive integers")
            size = math.prod(shape)
            if size > MAX_AGENT_OBSERVATION:
                raise ValueError(f"{size} entries, more than {MAX_AGENT_OBSERVATION}")
            if d["dtype"] not in ("float32", "float64"):
                raise ValueError(f"dtype {d['dtype']!r}")
            for bound in ("low", "high"):
                if not (isinstance(d[bound], list) and len(d[bound]) == size
                        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in d[bound])):
                    raise ValueError(f"{bound} must list {size} numbers")
            low = np.asarray(d["low"], dtype=d["dtype"]).reshape(shape)
            high = np.asarray(d["high"], dtype=d["dtype"]).reshape(shape)
            return spaces.Box(low, high, tuple(shape), dtype=d["dtype"])
        raise ValueError(f"type {d['type']!r}")
    except (KeyError, TypeError, ValueError) as e:
        raise AgentFormatError(f"agent card: {what} is not a Box, Discrete or MultiDiscrete space description "
                               f"({e})") from None


# --- observation normalisation (VecNormalize's statistics as numbers) ----------------------------

class ObsNormalizer:
    """``VecNormalize``'s observation transform: ``clip((obs - mean) / sqrt(var + epsilon), ±clip)``
    with frozen statistics (the same arithmetic, so the same float32 observations reach the policy)."""

    def __init__(self, mean, var, clip_obs: float, epsilon: float):
        self.mean = np.asarray(mean, dtype=np.float64)
        self.var = np.asarray(var, dtype=np.float64)
        self.clip_obs = float(clip_obs)
        self.epsilon = float(epsilon)
        if self.mean.shape != self.var.shape or self.mean.ndim != 1:
            raise AgentFormatError(f"agent card: obs_normalization mean and var must be lists of the same length, "
                                   f"got {self.mean.shape} and {self.var.shape}")
        if not (np.isfinite(self.mean).all() and np.isfinite(self.var).all() and (self.var >= 0).all()):
            raise AgentFormatError("agent card: obs_normalization mean and var must be finite and var >= 0")
        if not (self.clip_obs > 0 and self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise AgentFormatError("agent card: obs_normalization clip_obs and epsilon must be > 0")

    @classmethod
    def from_vecnormalize(cls, venv) -> "ObsNormalizer | None":
        if venv is None or not venv.norm_obs:
            return None
        if not hasattr(venv.obs_rms, "mean"):
            raise AgentFormatError("agent: VecNormalize over dict observations is not supported")
        return cls(venv.obs_rms.mean, venv.obs_rms.var, venv.clip_obs, venv.epsilon)

    @classmethod
    def from_json(cls, d: Any) -> "ObsNormalizer | None":
        if d is None:
            return None
        try:
            if not all(isinstance(d[k], list) and len(d[k]) <= MAX_AGENT_OBSERVATION
                       and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in d[k])
                       for k in ("mean", "var")):
                raise TypeError(f"mean and var must be lists of at most {MAX_AGENT_OBSERVATION} numbers")
            if not all(isinstance(d[k], (int, float)) and not isinstance(d[k], bool) for k in ("clip_obs", "epsilon")):
                raise TypeError("clip_obs and epsilon must be numbers")
            return cls(d["mean"], d["var"], d["clip_obs"], d["epsilon"])
        except (KeyError, TypeError) as e:
            raise AgentFormatError(f"agent card: obs_normalization needs mean, var, clip_obs and epsilon ({e})") from None

    def to_json(self) -> dict:
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "clip_obs": self.clip_obs, "epsilon": self.epsilon}

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        if obs.shape[-1:] != self.mean.shape:
            raise AgentFormatError(f"agent: observations have shape {obs.shape[-1:]}, its normalisation {self.mean.shape}")
        return np.clip((obs - self.mean) / np.sqrt(self.var + self.epsilon), -self.clip_obs, self.clip_obs).astype(np.float32)


# --- wrappers ------------------------------------------------------------------------------------

def wrapper_path(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def resolve_wrapper(path: str, trusted: bool = False):
    """The ``gymnasium.Wrapper`` subclass at import path ``module.Class``; modules outside
    :data:`SAFE_WRAPPER_PACKAGES` must already be imported unless ``trusted``. A path of a module that
    moved in 0.2 (``mooncake_gym.wrappers``, ``mooncake_gym.admission_features``) names its class in
    the new module (:data:`mooncake_gym._moved.MOVED`), without a warning."""
    import gymnasium as gym

    if not isinstance(path, str) or "." not in path:
        raise AgentFormatError(f"wrapper: expected an import path 'module.Class', got {path!r}")
    module_name, _, qualname = current_name(path).rpartition(".")  # a card written before 0.2 names the old module
    module = sys.modules.get(module_name)
    if module is None:
        if not (trusted or module_name.split(".")[0] in SAFE_WRAPPER_PACKAGES):
            raise AgentFormatError(
                f"wrapper: {path} is in module {module_name}, which is not imported; importing a module named by "
                "an agent file runs its code: import it yourself first, or pass trusted=True (--unsafe-pickle)")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise AgentFormatError(f"wrapper: cannot import {module_name} for {path}: {e}") from None
    cls = getattr(module, qualname, None)
    if not (isinstance(cls, type) and issubclass(cls, gym.Wrapper)):
        raise AgentFormatError(f"wrapper: {path} is not a gymnasium.Wrapper class")
    if (not trusted and not issubclass(cls, gym.ObservationWrapper)
            and cls.__module__.split(".")[0] in LIBRARY_PACKAGES):
        # the libraries' other wrappers record videos, write monitor files or open windows
        raise AgentFormatError(f"wrapper: {path} is not an observation wrapper; of gymnasium's and SB3's wrappers an "
                               "agent file may name only those unless trusted=True (--unsafe-pickle)")
    return cls


def wrapper_spec(wrapper) -> dict:
    """``{"class": import path, "kwargs": {...}}`` from a class, a path, a ``(class or path, kwargs)``
    pair or such a dict; checks the class can be found again by its path and the kwargs are JSON."""
    if isinstance(wrapper, dict):
        cls, kwargs = wrapper.get("class"), wrapper.get("kwargs", {})
    elif isinstance(wrapper, (tuple, list)) and len(wrapper) == 2:
        cls, kwargs = wrapper
    else:
        cls, kwargs = wrapper, {}
    path = cls if isinstance(cls, str) else wrapper_path(cls)
    if not isinstance(cls, str) and ("<locals>" in path or cls.__module__ == "__main__"):
        raise AgentFormatError(f"wrapper: {path} cannot be found again by import path; define it in an importable module")
    if not isinstance(cls, str) and resolve_wrapper(path, trusted=True) is not cls:
        raise AgentFormatError(f"wrapper: {path} does not name the class given")
    try:
        kwargs = json.loads(json.dumps(kwargs or {}, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise AgentFormatError(f"wrapper: keyword arguments of {path} must be JSON ({e})") from None
    if not isinstance(kwargs, dict):
        raise AgentFormatError(f"wrapper: keyword arguments of {path} must be a JSON object, got {kwargs!r}")
    return {"class": path, "kwargs": kwargs}


def apply_wrappers(env, specs: Sequence[dict], trusted: bool = False):
    """``env`` wrapped by each wrapper of ``specs`` in order (the first is innermost)."""
    for spec in specs:
        try:
            env = resolve_wrapper(spec["class"], trusted)(env, **spec["kwargs"])
        except TypeError as e:
            raise AgentFormatError(f"wrapper: {spec['class']}(env, **{spec['kwargs']}) failed: {e}") from None
    return env


def wrapper_chain(env) -> list[str]:
    """Import paths of the wrappers around ``env``, innermost first."""
    out = []
    while hasattr(env, "env"):
        out.append(wrapper_path(type(env)))
        env = env.env
    return out[::-1]


# --- the agent -----------------------------------------------------------------------------------

class Agent:
    """A policy that acts on an environment's observations: the network (an SB3 policy or model),
    the observation normalisation and wrappers it was trained with, and its card.

    :meth:`predict` takes a batch of raw observations (as the wrapped env returns them), the
    recurrent state and ``episode_start`` flags, and action masks; it normalises the observations
    and passes state and masks on only to policies that use them.
    """

    def __init__(self, policy, observation_space, action_space, env_id: str | None = None,
                 wrappers: Sequence[dict] = (), obs_norm: ObsNormalizer | None = None,
                 card: dict | None = None, source: str = "model", trusted: bool = False):
        self.policy = policy
        self.observation_space = observation_space
        self.action_space = action_space
        self.env_id = env_id
        self.wrappers = list(wrappers)
        self.obs_norm = obs_norm
        self.card = card or {}
        self.source = source          # 'weights' (no unpickling), 'pickle' (SB3's load), 'rllib' (a checkpoint) or 'model'
        self.trusted = trusted
        net = getattr(policy, "policy", policy)
        self.recurrent = hasattr(net, "lstm_hidden_state_shape")
        self.maskable = "action_masks" in inspect.signature(policy.predict).parameters

    def predict(self, obs, state=None, episode_start=None, deterministic: bool = True, action_masks=None):
        """Actions for a batch of observations; returns ``(actions, state)``."""
        obs = np.asarray(obs)
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        kwargs = {"deterministic": deterministic}
        if self.recurrent:
            kwargs.update(state=state, episode_start=episode_start)
        if self.maskable and action_masks is not None:
            kwargs["action_masks"] = action_masks
        return self.policy.predict(obs, **kwargs)

    def wrap(self, env):
        """``env`` behind the agent's wrappers, unless it already has exactly them; a clear error if
        it has some other combination of them."""
        if not self.wrappers:
            return env
        want = [w["class"] for w in self.wrappers]
        have = wrapper_chain(env)
        present = [p for p in have if p in want]
        if not present:
            return apply_wrappers(env, self.wrappers, self.trusted)
        if present == want:
            return env
        raise AgentFormatError(f"agent: trained behind wrappers {want} (innermost first), but the env has {present} of them")

    def check_wrappers(self) -> None:
        """Build the agent's wrappers around its own environment (its env id and the card's
        ``env_kwargs``) once, so that a wrapper that cannot be imported or refuses its arguments is
        an :class:`AgentFormatError` before any episode runs, not after the baselines."""
        if not self.wrappers or not self.env_id:
            return
        import gymnasium as gym

        kwargs = self.card.get("env_kwargs") or {}
        try:
            env = gym.make(self.env_id, **kwargs)
        except Exception as e:  # noqa: BLE001 -- an unknown id or bad kwargs, one line
            raise AgentFormatError(f"agent: cannot make its env {self.env_id} with {kwargs}: {e}") from None
        try:
            self.wrap(env)
        except (TypeError, ValueError) as e:
            raise AgentFormatError(f"agent: its wrappers do not build on {self.env_id}: {e}") from None
        finally:
            env.close()

    def check_fits(self, env) -> None:
        """Raise :class:`AgentFormatError` naming every difference between the agent and ``env``
        (observation and action spaces, env id)."""
        env_name = env.spec.id if getattr(env, "spec", None) is not None else type(env.unwrapped).__name__
        diffs = []
        for name in ("observation_space", "action_space"):
            mine, theirs = getattr(self, name), getattr(env, name)
            if mine is not None and mine != theirs:
                diffs.append(f"trained for {name} {_space_str(mine)}, but {env_name} has {_space_str(theirs)}")
        if self.env_id and getattr(env, "spec", None) is not None and env.spec.id != self.env_id:
            diffs.append(f"trained on env {self.env_id}, not {env.spec.id}")
        if diffs:
            hint = ""
            if self.card.get("env_kwargs") is not None:
                hint = f" (it was trained with env_kwargs {self.card['env_kwargs']})"
            elif not self.wrappers:
                hint = " (if it was trained behind observation wrappers, save it with save_agent(..., wrappers=...))"
            raise AgentFormatError("agent: " + "; ".join(diffs) + hint +
                                   "; evaluate it on the environment it was trained for, or retrain it for this one")

    def action_masks(self, env):
        """``env.action_masks()`` if the policy uses masks and the env (or a wrapper) has the method."""
        if not self.maskable:
            return None
        try:
            method = env.get_wrapper_attr("action_masks")
        except AttributeError:
            return None
        return np.asarray(method(), dtype=bool)


def _space_str(space) -> str:
    return f"{type(space).__name__}{tuple(space.shape)}" if hasattr(space, "low") else str(space)


def as_agent(model, env_id: str | None = None, wrappers: Sequence = (), vecnormalize=None) -> Agent:
    """An :class:`Agent` from an in-memory SB3 model (or anything with ``predict``); the observation
    normalisation comes from ``vecnormalize``, else from a ``VecNormalize`` the model is attached to."""
    if isinstance(model, Agent):
        return model
    if vecnormalize is None and hasattr(model, "get_vec_normalize_env"):
        vecnormalize = model.get_vec_normalize_env()
    norm = vecnormalize if isinstance(vecnormalize, ObsNormalizer) else ObsNormalizer.from_vecnormalize(vecnormalize)
    return Agent(model, getattr(model, "observation_space", None), getattr(model, "action_space", None),
                 env_id=env_id, wrappers=[wrapper_spec(w) for w in wrappers], obs_norm=norm, source="model")


# --- architecture --------------------------------------------------------------------------------

def describe_policy(model) -> dict:
    """The card's ``architecture``: allow-listed constructor settings of ``model.policy`` as JSON;
    an :class:`AgentFormatError` for networks the format cannot rebuild (custom feature extractors,
    activations outside :data:`ACTIVATIONS`)."""
    from stable_baselines3.common.torch_layers import FlattenExtractor

    policy = model.policy
    params = policy._get_constructor_parameters()
    if params.get("features_extractor_class", FlattenExtractor) is not FlattenExtractor or params.get("features_extractor_kwargs"):
        raise AgentFormatError("agent: only the default FlattenExtractor can be rebuilt without unpickling")
    activation = params["activation_fn"].__name__
    if activation not in ACTIVATIONS or getattr(__import__("torch").nn, activation) is not params["activation_fn"]:
        raise AgentFormatError(f"agent: activation {activation} is not one of {ACTIVATIONS}")
    arch = {"net_arch": params["net_arch"], "activation_fn": activation, "normalize_images": params["normalize_images"]}
    if "ortho_init" in params:
        arch["ortho_init"] = params["ortho_init"]
    if hasattr(policy, "share_features_extractor"):
        arch["share_features_extractor"] = bool(policy.share_features_extractor)
    if params.get("use_sde"):
        raise AgentFormatError("agent: gSDE policies are not supported by the format")
    if hasattr(policy, "lstm_actor"):
        arch.update(lstm_hidden_size=policy.lstm_actor.hidden_size, n_lstm_layers=policy.lstm_actor.num_layers,
                    shared_lstm=bool(policy.shared_lstm), enable_critic_lstm=policy.lstm_critic is not None)
    return json.loads(json.dumps(arch))


def _architecture_kwargs(arch: Any) -> dict:
    """Constructor keyword arguments from a card's ``architecture``, every key and type checked."""
    import torch

    if not isinstance(arch, dict):
        raise AgentFormatError(f"agent card: architecture must be a JSON object, got {type(arch).__name__}")
    kwargs = {}
    for key, value in arch.items():
        if key not in ARCHITECTURE_KEYS:
            raise AgentFormatError(f"agent card: architecture key {key!r} is not one of {sorted(ARCHITECTURE_KEYS)}")
        if not isinstance(value, ARCHITECTURE_KEYS[key]) or (ARCHITECTURE_KEYS[key] is int and isinstance(value, bool)):
            raise AgentFormatError(f"agent card: architecture {key} has the wrong type: {value!r}")
        kwargs[key] = value
    layers = kwargs.get("net_arch", [])
    lists = layers.values() if isinstance(layers, dict) else [layers]
    if isinstance(layers, dict) and not set(layers) <= {"pi", "vf", "qf"}:
        raise AgentFormatError(f"agent card: architecture net_arch keys must be pi/vf, got {sorted(layers)}")
    for sizes in lists:
        if not (isinstance(sizes, list) and all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= 65536 for s in sizes)):
            raise AgentFormatError(f"agent card: architecture net_arch must list layer sizes in 1..65536, got {layers!r}")
    for key in ("lstm_hidden_size", "n_lstm_layers"):
        if key in kwargs and not 0 < kwargs[key] <= 65536:
            raise AgentFormatError(f"agent card: architecture {key} must be in 1..65536, got {kwargs[key]}")
    if "activation_fn" in kwargs:
        if kwargs["activation_fn"] not in ACTIVATIONS:
            raise AgentFormatError(f"agent card: activation_fn {kwargs['activation_fn']!r} is not one of {ACTIVATIONS}")
        kwargs["activation_fn"] = getattr(torch.nn, kwargs["activation_fn"])
    return kwargs


def _mlp_parameters(inputs: int, sizes: Sequence[int], outputs: int) -> int:
    """Weights and biases of the fully connected layers ``inputs -> sizes... -> outputs``."""
    widths = [inputs, *sizes, outputs]
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def parameter_bound(algorithm: str, observation_space, action_space, kwargs: dict) -> int:
    """An upper bound on the parameters of the network a card describes, from its sizes alone:
    every network the algorithm's policy may build is counted (actor and critic, DQN's target
    network, an LSTM for the actor and one for the critic)."""
    features = math.prod(observation_space.shape)
    # the actor's outputs: one logit per action, or per value of each dimension (MultiDiscrete)
    actions = int(action_space.n) if hasattr(action_space, "n") else int(sum(action_space.nvec))
    layers = kwargs.get("net_arch", [64, 64])
    per_net = [list(v) for v in layers.values()] if isinstance(layers, dict) else [list(layers)]
    widest = max(per_net, key=lambda sizes: sum(sizes), default=[])
    hidden = kwargs.get("lstm_hidden_size", 256) if algorithm == "RecurrentPPO" else 0
    total = 0
    if hidden:
        depth = kwargs.get("n_lstm_layers", 1)
        one = 4 * (hidden * (features + hidden) + 2 * hidden) + (depth - 1) * 4 * (2 * hidden * hidden + 2 * hidden)
        total += 2 * one
        features = hidden
    nets = 2 if algorithm == "DQN" else 1
    total += nets * _mlp_parameters(features, widest, actions) + _mlp_parameters(features, widest, 1)
    return total


def _check_card_fields(card: dict, where: Path) -> None:
    """Every field the loader reads has its JSON type, before anything is sized from it."""
    kinds = {"format": str, "env_id": str, "algorithm": str, "policy": str, "sha256": str, "architecture": dict,
             "observation_space": dict, "action_space": dict, "wrappers": (list, type(None)),
             "obs_normalization": (dict, type(None)), "env_kwargs": (dict, type(None))}
    for key, kind in kinds.items():
        if key in card and not isinstance(card[key], kind):
            expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise AgentFormatError(f"agent card: {where}: {key} must be a JSON {expected.replace('NoneType', 'null')}, "
                                   f"got {type(card[key]).__name__}")


# --- saving and loading --------------------------------------------------------------------------

def card_path(zip_path: str | os.PathLike) -> Path:
    return Path(zip_path).with_suffix(".json")


def format_card(model, env_id: str, wrappers: Sequence = (), vecnormalize=None, algorithm: str | None = None) -> dict:
    """The card fields of the format for ``model``; written by :func:`save_agent` and mooncake_gym/agents/train.py."""
    agent = as_agent(model, env_id, wrappers, vecnormalize)
    name = algorithm or type(model).__name__
    if name not in ALGORITHMS:
        raise AgentFormatError(f"agent: algorithm {name} is not one of {sorted(ALGORITHMS)}")
    return {"format": FORMAT, "env_id": env_id, "algorithm": name, "policy": POLICIES[name],
            "architecture": describe_policy(model),
            "observation_space": space_to_json(model.observation_space),
            "action_space": space_to_json(model.action_space),
            "wrappers": agent.wrappers,
            "obs_normalization": agent.obs_norm.to_json() if agent.obs_norm is not None else None}


def save_agent(model, path: str | os.PathLike, env_id: str, wrappers: Sequence = (), vecnormalize=None,
               card: dict | None = None) -> Path:
    """Write ``model`` as ``path`` (an SB3 zip) and its card ``path`` with ``.json``: the format's
    fields (:func:`format_card`), the zip's sha256, and the extra fields of ``card``. Each file is
    written whole or not at all (the zip first: a new zip beside an old card fails its sha256)."""
    path = Path(path)
    if path.suffix != ".zip":
        raise AgentFormatError(f"agent: the file name must end in .zip, got {path}")
    fields = format_card(model, env_id, wrappers, vecnormalize)
    blob = io.BytesIO()
    model.save(blob)
    write_atomic(path, blob.getvalue())  # each file whole or not at all; a new zip beside an old card is refused
    doc = {**(card or {}), **fields, "sha256": sha256_of(path)}
    write_atomic(card_path(path), json.dumps(doc, indent=2) + "\n")
    return path


def read_card(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise AgentFormatError(f"agent card: {path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise AgentFormatError(f"agent card: {path} must hold a JSON object")
    return doc


def _read_weights(zip_path: Path, max_bytes: int) -> dict:
    """``policy.pth`` of an SB3 zip as a dict of tensors, without unpickling anything else; the
    member is inflated in chunks and refused once it passes ``max_bytes`` (whatever its header says)."""
    import torch

    too_big = AgentFormatError(f"agent: {zip_path}: policy.pth is larger than the {max_bytes:,} bytes its card's "
                               "architecture can need")
    try:
        with zipfile.ZipFile(zip_path) as zf:
            if "policy.pth" not in zf.namelist():
                raise AgentFormatError(f"agent: {zip_path} has no policy.pth (not an SB3 model zip)")
            if zf.getinfo("policy.pth").file_size > max_bytes:
                raise too_big
            chunks, size = [], 0
            with zf.open("policy.pth") as member:
                while chunk := member.read(1 << 20):
                    size += len(chunk)
                    if size > max_bytes:
                        raise too_big
                    chunks.append(chunk)
            blob = b"".join(chunks)
    except (zipfile.BadZipFile, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise AgentFormatError(f"agent: {zip_path} is not a readable zip archive ({e})") from None
    try:
        state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- torch raises UnpicklingError, RuntimeError, EOFError...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AgentFormatError(f"agent: {zip_path}: policy.pth is not a plain tensor state dict, refusing it "
                               f"(torch.load weights_only: {first})") from None
    if not (isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())):
        raise AgentFormatError(f"agent: {zip_path}: policy.pth is not a dict of tensors")
    return state


def load(zip_path: str | os.PathLike, card: dict | None = None, trusted: bool = False, algorithm: str | None = None) -> Agent:
    """Load the agent at ``zip_path`` (card beside it, or ``card``): weights only, unless there is no
    usable card and ``trusted`` (then SB3's ``load`` of ``algorithm``, default the card's or PPO)."""
    zip_path = Path(zip_path)
    check_input_file(zip_path, "agent")
    if card is None and card_path(zip_path).is_file():
        card = read_card(card_path(zip_path))
    if card is None or card.get("format") != FORMAT:
        why = (f"has no card {card_path(zip_path).name}" if card is None else
               f"has a card without format {FORMAT!r} (got {card.get('format')!r})")
        if not trusted:
            raise AgentFormatError(
                f"agent: {zip_path} {why}, so it can only be loaded by unpickling it, which can run code: pass "
                "trusted=True (--unsafe-pickle) only for a file you trust, or write a card with save_agent()")
        return _load_pickled(zip_path, card or {}, algorithm)
    return _load_weights(zip_path, card, trusted)


def _load_weights(zip_path: Path, card: dict, trusted: bool) -> Agent:
    """The card checked whole (fields, spaces, architecture, the network's size bound), then the
    zip's size and sha256, then the weights read within the card's bound, then the network built."""
    for key in ("algorithm", "policy", "architecture", "observation_space", "action_space", "sha256", "env_id"):
        if key not in card:
            raise AgentFormatError(f"agent card: {card_path(zip_path)} has no {key!r}")
    _check_card_fields(card, card_path(zip_path))
    algo = card["algorithm"]
    if algo not in ALGORITHMS:
        raise AgentFormatError(f"agent card: algorithm {algo!r} is not one of {sorted(ALGORITHMS)}")
    if card["policy"] != POLICIES[algo]:
        raise AgentFormatError(f"agent card: policy {card['policy']!r} is not allowed for {algo} (only {POLICIES[algo]})")
    obs_space = space_from_json(card["observation_space"], "observation_space")
    act_space = space_from_json(card["action_space"], "action_space")
    if obs_space.__class__.__name__ != "Box" or act_space.__class__.__name__ == "Box":
        raise AgentFormatError("agent card: expected a Box observation_space and a Discrete or MultiDiscrete "
                               "action_space")
    kwargs = _architecture_kwargs(card["architecture"])
    parameters = parameter_bound(algo, obs_space, act_space, kwargs)
    if parameters > MAX_AGENT_PARAMETERS:
        raise AgentFormatError(f"agent card: its architecture has up to {parameters:,} parameters, more than "
                               f"{MAX_AGENT_PARAMETERS:,} (mooncake_gym.model.limits.MAX_AGENT_PARAMETERS)")
    max_weight_bytes = 4 * parameters + (1 << 20)  # float32 tensors and the pickle's names and headers
    # the zip also holds the optimiser's state (two moments per parameter) and SB3's JSON
    if zip_path.stat().st_size > 3 * max_weight_bytes + (4 << 20):
        raise AgentFormatError(f"agent: {zip_path} is larger than an agent of its card's architecture can be")
    if sha256_of(zip_path) != card["sha256"]:
        raise AgentFormatError(f"agent: {zip_path} does not match the sha256 in its card (file changed or corrupt)")
    policy_cls = algorithm_class(algo).policy_aliases[POLICIES[algo]]
    wrappers = card.get("wrappers") or []
    if not isinstance(wrappers, list) or not all(isinstance(w, dict) and isinstance(w.get("class"), str)
                                                 and isinstance(w.get("kwargs", {}), dict) for w in wrappers):
        raise AgentFormatError("agent card: wrappers must be a list of {\"class\": path, \"kwargs\": {...}}")
    wrappers = [{"class": w["class"], "kwargs": w.get("kwargs", {})} for w in wrappers]
    norm = ObsNormalizer.from_json(card.get("obs_normalization"))
    if norm is not None and norm.mean.shape != obs_space.shape:
        raise AgentFormatError(f"agent card: obs_normalization has {norm.mean.shape[0]} entries, observations {obs_space.shape}")
    state = _read_weights(zip_path, max_weight_bytes)
    if "ortho_init" in inspect.signature(policy_cls).parameters:
        # every parameter is overwritten by the weights below (strict): SB3's orthogonal initialisation
        # (a QR factorisation per layer, about 1.4 s per agent here) would be thrown away
        kwargs["ortho_init"] = False
    try:
        policy = policy_cls(obs_space, act_space, lambda _: 0.0, **kwargs)
    except (TypeError, ValueError, RuntimeError, MemoryError) as e:
        raise AgentFormatError(f"agent card: cannot build {policy_cls.__name__} from its architecture: {e}") from None
    try:
        policy.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise AgentFormatError(f"agent: the weights in {zip_path} do not fit the card's architecture: "
                               f"{str(e).splitlines()[0]}") from None
    policy.set_training_mode(False)
    return Agent(policy, obs_space, act_space, env_id=card["env_id"], wrappers=wrappers, obs_norm=norm,
                 card=card, source="weights", trusted=trusted)


def _load_pickled(zip_path: Path, card: dict, algorithm: str | None) -> Agent:
    cls = algorithm_class(algorithm or card.get("algorithm", "PPO"))
    try:
        model = cls.load(zip_path, device="cpu")
    except Exception as e:  # noqa: BLE001 -- whatever the unpickled file raises, one line
        raise AgentFormatError(f"agent: {zip_path} could not be loaded as an SB3 {cls.__name__} zip: {type(e).__name__}: {e}") from None
    wrappers = [wrapper_spec(w) for w in card.get("wrappers") or []]
    return Agent(model, model.observation_space, model.action_space, env_id=card.get("env_id"), wrappers=wrappers,
                 obs_norm=ObsNormalizer.from_json(card.get("obs_normalization")), card=card, source="pickle", trusted=True)
