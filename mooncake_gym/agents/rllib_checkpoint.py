"""An RLlib checkpoint as an agent: the trained module acting deterministically on observations.

``mooncake-gym train --backend rllib --out DIR`` (or any RLlib algorithm's ``save``) writes a
checkpoint folder with ``rllib_checkpoint.json`` at its top. :func:`load_checkpoint` reads its
single-agent module (``learner_group/learner/rl_module/default_policy``) into an
:class:`~mooncake_gym.agents.agentfile.Agent`, so that ``compare --agent DIR``, ``lab grade --agent
DIR`` and :func:`~mooncake_gym.evaluation.evaluate` run it like any other agent: same seeds, same
tables. Its action is the mode of the module's action distribution (RLlib's own deterministic
action: the arg-max of the logits). The env id and ``env_config`` it was trained on come from the
checkpoint's algorithm config.

RLlib writes its checkpoints with pickle, so loading one can run code: it is loaded only with
``trusted=True`` (``--unsafe-pickle``). It needs the ``ray`` extra; without it the error names the
option and the extra. Only RLlib's default observation pipeline is understood (observations reach
the module as the env returns them): a checkpoint with other env-to-module connectors (an
observation filter) or a recurrent module is refused, since its module alone would act on other
inputs.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from mooncake_gym.agents.agentfile import Agent, AgentFormatError

#: The file that marks an RLlib checkpoint folder.
MARKER = "rllib_checkpoint.json"
#: Where the single-agent module sits in an algorithm checkpoint.
MODULE_DIR = Path("learner_group", "learner", "rl_module", "default_policy")
#: The env-to-module connectors of RLlib's default pipeline (observations batched as they are).
DEFAULT_CONNECTORS = ("AddObservationsFromEpisodesToBatch", "AddTimeDimToBatchAndZeroPad",
                      "AddStatesFromEpisodesToBatch", "BatchIndividualItems", "NumpyToTensor")


def require_ray(what: str = "--backend rllib") -> None:
    """``ValueError`` naming ``what`` and the extra to install, unless Ray RLlib and Tune import."""
    try:
        import ray  # noqa: F401
        import ray.tune  # noqa: F401
        from ray.rllib.algorithms.ppo import PPOConfig  # noqa: F401
    except ImportError:
        raise ValueError(f"{what}: Ray RLlib and Tune are not installed; pip install 'mooncake-gym[ray]' "
                         "(in its own venv: it installs gymnasium 1.2; see docs/scale-out.md)") from None


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an RLlib checkpoint folder (it holds :data:`MARKER`)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MARKER))


class ModulePolicy:
    """An RLlib module behind :class:`Agent`'s ``predict``: a batch of observations in, one action
    per observation out (the distribution's mode, or a sample with ``deterministic=False``)."""

    def __init__(self, module):
        self.module = module
        self.distribution = module.get_inference_action_dist_cls()

    def predict(self, obs, deterministic: bool = True):
        import torch

        with torch.no_grad():
            out = self.module.forward_inference({"obs": torch.as_tensor(np.asarray(obs, dtype=np.float32))})
        dist = self.distribution.from_logits(out["action_dist_inputs"])
        if deterministic:
            dist = dist.to_deterministic()
        return dist.sample().numpy(), None


def _unpickle(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f)


def _constructor_arguments(path: Path) -> tuple[tuple, dict]:
    args, kwargs = _unpickle(path)["ctor_args_and_kwargs"]
    return args, kwargs


def _trained_on(root: Path) -> tuple[str | None, dict]:
    """The env id (a ``module:`` prefix dropped) and ``env_config`` of the checkpoint's algorithm config."""
    args, kwargs = _constructor_arguments(root / "class_and_ctor_args.pkl")
    config = args[0] if args else kwargs.get("config", {})
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    env = config.get("env")
    return (env.rpartition(":")[2] if isinstance(env, str) else None), dict(config.get("env_config") or {})


def load_checkpoint(path: str | os.PathLike, trusted: bool = False, what: str = "agent") -> Agent:
    """The RLlib checkpoint folder ``path`` as an :class:`Agent` (module docstring); ``what`` names the
    input in errors (``--agent`` on the command line)."""
    root = Path(path)
    require_ray(f"{what}: {root} is an RLlib checkpoint")
    if not trusted:
        raise AgentFormatError(f"{what}: {root} is an RLlib checkpoint, which loads only by unpickling (it can run "
                               "code): pass --unsafe-pickle (trusted=True) for a checkpoint you trust")
    if not (root / MODULE_DIR).is_dir():
        raise AgentFormatError(f"{what}: {root} has no single-agent module {MODULE_DIR} (multi-agent checkpoints "
                               "are not supported)")
    connectors = root / "env_runner" / "env_to_module_connector" / "class_and_ctor_args.pkl"
    if connectors.is_file():
        names = [piece[0].__name__ for piece in _constructor_arguments(connectors)[1].get("connectors", [])]
        extra = [n for n in names if n not in DEFAULT_CONNECTORS]
        if extra:
            raise AgentFormatError(f"{what}: {root} transforms observations with {extra} before its module; only "
                                   "RLlib's default pipeline is supported")
    from ray.rllib.core.rl_module.rl_module import RLModule

    module = RLModule.from_checkpoint(str((root / MODULE_DIR).resolve()))
    if module.is_stateful():
        raise AgentFormatError(f"{what}: {root} has a recurrent module; only feed-forward RLlib modules are supported")
    module.eval()
    env_id, env_config = _trained_on(root)
    return Agent(ModulePolicy(module), module.observation_space, module.action_space, env_id=env_id,
                 card={"env_kwargs": env_config, "rllib_checkpoint": str(root)}, source="rllib", trusted=True)
