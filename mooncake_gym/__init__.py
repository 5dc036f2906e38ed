"""mooncake-gym: a simulator and Gymnasium environments for KV-cache-centric LLM-serving scheduling.

Importing the package registers the environments (``mooncake_gym/PrefillRouting-v0``,
``OverloadAdmission-v0``, ``PrefillRouting-v1``, ``OverloadAdmission-v1``, ``Conductor-v1``) and
every benchmark scenario (:mod:`mooncake_gym.evaluation.scenarios`) with Gymnasium. :func:`engine` names
the default engine of the simulators: ``"native"`` (the C++ engine built at install, docs/engine.md) or
``"python"`` (the reference: no C++ compiler at install, which importing warns of once, or
``MOONCAKE_GYM_ENGINE=python``).
"""

__version__ = "0.1.0"

from mooncake_gym import _moved
from mooncake_gym._engine import engine, warn_if_missing as _warn_if_missing
from mooncake_gym._native import compiled
from mooncake_gym._engine import cluster as _native_cluster  # noqa: F401  (the cluster simulator's engine= switch)

_moved.install()  # the modules' paths before 0.2 still import, with a DeprecationWarning

_warn_if_missing()  # once: the native engine is not built (the reference runs), or older than its sources

from mooncake_gym.evaluation.scenarios import register_scenarios as _register_scenarios

_register_scenarios()
