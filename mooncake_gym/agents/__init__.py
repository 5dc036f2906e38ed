"""Trained agents shipped with mooncake-gym, installed as ``mooncake_gym.agents``.

Each agent is an SB3 ``.zip`` with a JSON card beside it (``ppo_routing.json``) in the format of
:mod:`mooncake_gym.agents.agentfile`: env id and kwargs, algorithm and network architecture,
spaces, observation normalisation and wrappers, training seed, timesteps, wall time, library
versions, evaluation results and the zip's sha256. :func:`load_agent` never unpickles: it builds
the policy from the card and reads the weights as tensors only. The sha256 of each shipped zip
and card is recorded here, in the package's code, so a tampered zip or card is refused
(:class:`AgentIntegrityError`). A user's own file is loaded the same way from its card; one
without a card is loaded only with ``trusted=True``, by unpickling it (which can run code), and so
is an RLlib checkpoint folder (:mod:`mooncake_gym.agents.rllib_checkpoint`; the ``ray`` extra).
"""

from __future__ import annotations

import json
import os
import sys
from importlib import resources
from pathlib import Path

from mooncake_gym.agents.agentfile import Agent, AgentFormatError, load, save_agent, sha256_of
from mooncake_gym.agents.rllib_checkpoint import is_checkpoint, load_checkpoint

__all__ = ["Agent", "AgentFormatError", "AgentIntegrityError", "SHIPPED", "SHIPPED_SHA256", "agent_dir", "available",
           "card", "load_agent", "load_user_agent", "save_agent"]

#: Shipped agents by name -> the problem they solve.
SHIPPED = {"ppo_routing": "routing", "ppo_admission": "admission",
           "ppo_admission_v1": "admission-v1", "ppo_routing_saturated": "routing",
           "expert_cluster_trace": "routing-cluster", "ppo_cluster_saturated": "routing-cluster",
           "ppo_cluster_heterogeneous": "routing-cluster", "expert_cluster_synthetic": "routing-cluster"}
#: sha256 of each shipped agent's zip and card (update both when an agent is retrained).
SHIPPED_SHA256 = {
    # the tutorial's PPO from scratch (docs/tutorial.md); its card's "scenarios": [] keeps it off every
    # scenario's table (it lands on kvcentric: 1.35x the best tuned rule on routing-saturated)
    "ppo_routing": {"zip": "e59cf80ea9a8048d8a1b14f03750bc2f3181f8a1ed604d13e6738a6fff031401",
                    "json": "778ad2f9ce6a9b42519dc3a439d6254c7dcb9620f647e7f0b45a8ff212f47b65"},
    "ppo_admission": {"zip": "62891c2c5b55734adea4b309dbd9b268c345e3a41981a9ae9112e43ec1f5a6f0",
                      "json": "5a07e537b6cf6933939d0c04860849f80515d5574221ee9f677e17bef7c6d9f6"},
    # issue 13: CEM on a linear policy then PPO on OverloadAdmission-v1, behind
    # mooncake_gym.envs.wrappers.AdmissionRuleFeatures (mooncake_gym/agents/warmstart_admission.py)
    "ppo_admission_v1": {"zip": "ba7c877044c4e25315bb917fa6859bc1e7f9343101ecfd0493e4d5f749a5e3ef",
                         "json": "b23e26e2ea5dfc7e78be0a66e19ddac58793244272695d1c3e8d661c61ea300e"},
    # issue 26: a per-scenario agent for routing-saturated: expert iteration (DAgger over the rollout
    # reference, mooncake_gym/agents/expert.py), then PPO with the ttft reward, behind RoutingRelativeFeatures
    "ppo_routing_saturated": {"zip": "92b8f2f643537ad0f008f1607d4f82e3f69d79879ce573e9be0237041d305eac",
                              "json": "6c45fec33511198e6c598556119c2a16731f1c0d5702ee6e545009b918e02599"},
    # issue 26: realistic-cluster agents (PrefillRouting-v1), expert iteration (mooncake_gym/agents/expert.py)
    # behind RoutingRelativeFeatures; per-scenario (their cards' "scenarios"). expert_cluster_trace: trained on
    # routing-cluster-long-context (the trace's requests i.i.d.), for routing-cluster-mooncake-trace too
    "expert_cluster_trace": {"zip": "f35ae9a5ca9d909a0720407c5e9b211867c8d0fcd56935ac46564ce039d3b21d",
                             "json": "60982010b9d312498971e5902ed63b00257d9c8ca929128d318b01389fba0575"},
    # ppo_cluster_saturated: the student of routing-cluster-saturated, then PPO with the ttft reward
    "ppo_cluster_saturated": {"zip": "c7b22bd112ff75e4e1ca3b50b605fba46cfe55b671546e7aeca32af9efe83a9e",
                              "json": "cb66afa7728aed4977dd486735ecfeab4e56e8401adab2d8ce6849f308a0b7e0"},
    # ppo_cluster_heterogeneous: the same recipe on routing-cluster-heterogeneous
    "ppo_cluster_heterogeneous": {"zip": "0f312a7b48ae9cd1a52fb5c54c638f56ed45a5737b5d2eb0ee6a001159a4f161",
                                  "json": "6d0bef0322ead540a008ec849bf28e9096ab52ccd3d8b70e11942b169a35e870"},
    # expert_cluster_synthetic: trained only on synthetic workloads (routing-cluster-saturated, -heterogeneous and
    # the saturated cluster with long prompts of LONG_PROMPT_SYNTHETIC), for windows of Mooncake's trace among others
    "expert_cluster_synthetic": {"zip": "a9f949bb060d6dcc986407b463b16ee1dc33c23387f21be4120a7e1cf3448188",
                                 "json": "4a01f5939a2cc5151e333e27a00d7415a0893e1cd3878e26c556fa0443c72630"},
}


class AgentIntegrityError(AgentFormatError):
    """A shipped agent's zip or card does not match the sha256 recorded in the package."""


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


def load_agent(name_or_path: str | os.PathLike, trusted: bool = False, device: str = "cpu") -> Agent:
    """Load a shipped agent by name (zip and card checked against :data:`SHIPPED_SHA256`), or a
    user's zip with a card beside it; without unpickling. ``trusted=True`` also allows loading a
    zip without a card by unpickling it (SB3's ``load``: it can run code) and importing wrapper
    modules the card names, and loading an RLlib checkpoint folder (RLlib pickles it; needs the
    ``ray`` extra). ``device`` must be 'cpu' (the envs run on the CPU)."""
    if device != "cpu":
        raise ValueError(f"device: agents are loaded on the CPU, got {device!r}")
    name = str(name_or_path)
    if name in SHIPPED:
        d = agent_dir()
        for ext in ("zip", "json"):
            path = d / f"{name}.{ext}"
            if not path.exists():
                raise FileNotFoundError(f"agent: shipped agent {name!r} is not present at {path}")
            actual, expected = sha256_of(path), SHIPPED_SHA256[name][ext]
            if actual != expected:
                raise AgentIntegrityError(
                    f"agent: {path} does not match the sha256 recorded for it in mooncake_gym.agents "
                    f"({actual[:16]}... != {expected[:16]}...); refusing to load a changed shipped agent")
        return load(d / f"{name}.zip", card=card(name))
    if is_checkpoint(name):
        return load_checkpoint(name, trusted=trusted)
    return load(name, trusted=trusted)


def load_user_agent(path: str | os.PathLike, trusted: bool = False) -> Agent:
    """A user's agent for a run (``compare --agent``, ``lab grade --agent``): :func:`load_agent`, its
    wrappers built once on its own environment before any episode (:meth:`Agent.check_wrappers`),
    and a note on stderr if it was unpickled (an RLlib checkpoint folder always is)."""
    if is_checkpoint(path):  # its errors name the option
        agent = load_checkpoint(path, trusted=trusted, what="--agent")
    else:
        agent = load_agent(path, trusted=trusted)
    agent.check_wrappers()
    if agent.source in ("pickle", "rllib"):
        print(f"note: {path} was unpickled (--unsafe-pickle): loading it could run code", file=sys.stderr)
    return agent
