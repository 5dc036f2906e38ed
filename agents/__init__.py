"""Trained PPO agents shipped with mooncake-gym, installed as ``mooncake_gym.agents``.

Each agent is an SB3 ``.zip`` with a JSON card beside it (``ppo_routing.json``): env id and
kwargs, training seed, timesteps, wall time, library versions, evaluation results and the zip's
sha256. :func:`load_agent` verifies the sha256 before loading, because an SB3 zip contains pickled
objects and loading one can run arbitrary code: a file that does not match its card is refused.
A user's own file (``load_agent(path, trusted=True)``) is loaded without a card, at the user's risk.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

#: Shipped agents by name -> the problem they solve.
SHIPPED = {"ppo_routing": "routing", "ppo_admission": "admission"}


class AgentIntegrityError(ValueError):
    """A shipped agent's file does not match the sha256 in its card."""


def agent_dir() -> Path:
    return Path(str(resources.files("mooncake_gym.agents")))


def card(name: str) -> dict:
    """The JSON card of a shipped agent."""
    path = agent_dir() / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"agent: no card {path}")
    return json.loads(path.read_text())


def available() -> dict[str, str]:
    """Shipped agents whose zip and card are both present: ``{name: problem}``."""
    d = agent_dir()
    return {n: p for n, p in SHIPPED.items() if (d / f"{n}.zip").exists() and (d / f"{n}.json").exists()}


def load_agent(name_or_path: str | os.PathLike, trusted: bool = False, device: str = "cpu"):
    """Load a shipped agent by name (sha256 verified against its card), or a user's zip with ``trusted=True``."""
    from stable_baselines3 import PPO

    from .train import sha256_of

    name = str(name_or_path)
    if name in SHIPPED:
        path = agent_dir() / f"{name}.zip"
        if not path.exists():
            raise FileNotFoundError(f"agent: shipped agent {name!r} is not present at {path}")
        expected = card(name)["sha256"]
        actual = sha256_of(path)
        if actual != expected:
            raise AgentIntegrityError(
                f"agent: {path} does not match its card (sha256 {actual[:16]}... != {expected[:16]}...); "
                "refusing to load it: an SB3 zip holds pickled objects and a tampered one can run code")
        return PPO.load(path, device=device)
    if not trusted:
        raise ValueError(f"agent: {name!r} is not a shipped agent ({sorted(SHIPPED)}); loading a user's SB3 zip "
                         "unpickles objects and can run code: pass trusted=True (--agent PATH) only for files you trust")
    if not os.path.isfile(name):
        raise FileNotFoundError(f"agent: no such file {name!r}")
    return PPO.load(name, device=device)
