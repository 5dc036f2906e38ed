"""mooncake-gym: a simulator and Gymnasium environments for KV-cache-centric LLM-serving scheduling.

Importing the package registers the environments (``mooncake_gym/PrefillRouting-v0``,
``OverloadAdmission-v0``, ``PrefillRouting-v1``, ``OverloadAdmission-v1``, ``Conductor-v1``) and
every benchmark scenario (:mod:`mooncake_gym.evaluation.scenarios`) with Gymnasium. :func:`compiled` lists the
modules that run compiled (opt-in: ``make install-fast``), [] for the pure-Python package.
"""

__version__ = "0.1.0"

from mooncake_gym import _moved
from mooncake_gym._native import compiled, warn_if_stale as _warn_if_stale

_moved.install()  # the modules' paths before 0.2 still import, with a DeprecationWarning

_warn_if_stale()  # before anything imports a compiled module that a newer .py should replace

from mooncake_gym.evaluation.scenarios import register_scenarios as _register_scenarios

_register_scenarios()
