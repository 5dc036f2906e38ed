"""mooncake-gym: a simulator and Gymnasium environments for KV-cache-centric LLM-serving scheduling.

Importing the package registers ``mooncake_gym/PrefillRouting-v0`` and
``mooncake_gym/OverloadAdmission-v0`` with Gymnasium.
"""

__version__ = "0.1.0"

from .envs import register_envs as _register_envs

_register_envs()
