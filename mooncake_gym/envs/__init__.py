"""The Gymnasium environments; importing :mod:`mooncake_gym` registers their ids."""

import warnings

import gymnasium as gym

from mooncake_gym.envs.overload_admission import OverloadAdmissionEnv
from mooncake_gym.envs.prefill_routing import PrefillRoutingEnv
from mooncake_gym.envs.prefill_routing_v1 import PrefillRoutingV1Env
from mooncake_gym.envs.overload_admission_v1 import OverloadAdmissionV1Env
from mooncake_gym.envs.conductor_v1 import ConductorV1Env

ROUTING_ENV_ID = "mooncake_gym/PrefillRouting-v0"
ADMISSION_ENV_ID = "mooncake_gym/OverloadAdmission-v0"
ROUTING_V1_ENV_ID = "mooncake_gym/PrefillRouting-v1"
ADMISSION_V1_ENV_ID = "mooncake_gym/OverloadAdmission-v1"
CONDUCTOR_ENV_ID = "mooncake_gym/Conductor-v1"


# v0 and v1 are different problems on different clusters (the lecture's toy and the realistic
# presets), both maintained: gymnasium's "v0 is out of date, consider upgrading to v1" advice is
# wrong for them, so it is silenced for these ids only.
warnings.filterwarnings("ignore", message=r".*mooncake_gym/(PrefillRouting|OverloadAdmission)-v0 is out of date")


def register_envs() -> None:
    if ROUTING_ENV_ID not in gym.registry:
        gym.register(ROUTING_ENV_ID, entry_point="mooncake_gym.envs.prefill_routing:PrefillRoutingEnv",
                     vector_entry_point="mooncake_gym.envs.vector:make_routing_vector")
    if ADMISSION_ENV_ID not in gym.registry:
        gym.register(ADMISSION_ENV_ID, entry_point="mooncake_gym.envs.overload_admission:OverloadAdmissionEnv")
    for env_id, entry_point, vector in (
            (ROUTING_V1_ENV_ID, "mooncake_gym.envs.prefill_routing_v1:PrefillRoutingV1Env", "make_routing_v1_vector"),
            (ADMISSION_V1_ENV_ID, "mooncake_gym.envs.overload_admission_v1:OverloadAdmissionV1Env",
             "make_admission_v1_vector"),
            (CONDUCTOR_ENV_ID, "mooncake_gym.envs.conductor_v1:ConductorV1Env", None)):
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry_point,
                         vector_entry_point=vector and f"mooncake_gym.envs.vector:{vector}")


__all__ = ["PrefillRoutingEnv", "OverloadAdmissionEnv", "ROUTING_ENV_ID", "ADMISSION_ENV_ID", "register_envs",
           "PrefillRoutingV1Env", "OverloadAdmissionV1Env", "ConductorV1Env", "ROUTING_V1_ENV_ID",
           "ADMISSION_V1_ENV_ID", "CONDUCTOR_ENV_ID"]
