"""The Gymnasium environments; importing :mod:`mooncake_gym` registers their ids."""

import gymnasium as gym

from .overload_admission import OverloadAdmissionEnv
from .prefill_routing import PrefillRoutingEnv

ROUTING_ENV_ID = "mooncake_gym/PrefillRouting-v0"
ADMISSION_ENV_ID = "mooncake_gym/OverloadAdmission-v0"


def register_envs() -> None:
    if ROUTING_ENV_ID not in gym.registry:
        gym.register(ROUTING_ENV_ID, entry_point="mooncake_gym.envs.prefill_routing:PrefillRoutingEnv")
    if ADMISSION_ENV_ID not in gym.registry:
        gym.register(ADMISSION_ENV_ID, entry_point="mooncake_gym.envs.overload_admission:OverloadAdmissionEnv")


__all__ = ["PrefillRoutingEnv", "OverloadAdmissionEnv", "ROUTING_ENV_ID", "ADMISSION_ENV_ID", "register_envs"]
