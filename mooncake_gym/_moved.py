"""The modules that moved into the layer packages (0.2), and the importer that keeps their old
paths working for one version with a ``DeprecationWarning``; and :func:`renamed`, the same for an
attribute that was renamed.

``import mooncake_gym.routing`` (or ``from mooncake_gym import routing``) gives the module
:mod:`mooncake_gym.sim.routing` itself, not a copy: its functions, classes and private names are
the same objects. :data:`MOVED` is the map; :func:`current_name` translates an old dotted path
(an agent card's wrapper, say) without importing anything.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

#: old module (under ``mooncake_gym.``) -> its new place
MOVED = {  # mooncake_gym.evaluation and mooncake_gym.cli became packages that export what the modules did
    "costmodel": "model.costmodel", "presets": "model.presets", "workload": "model.workload",
    "prediction": "model.prediction", "limits": "model.limits",
    "policy": "sim.policy", "prefixcache": "sim.prefixcache", "cluster": "sim.prefill", "decode": "sim.decode",
    "routing": "sim.routing", "observation": "sim.observation", "conductor": "sim.cluster", "overload": "sim.admission",
    "bounds": "analysis.bounds", "cacheanalysis": "analysis.cache", "calibration": "analysis.calibration",
    "wrappers": "envs.wrappers", "admission_features": "envs.wrappers",
    "scenarios": "evaluation.scenarios", "rllib": "agents.rllib",
    "compare": "experiments.compare", "tune": "experiments.tune", "clusterrun": "experiments.preset_runs",
    "report": "reporting.tables", "plots": "reporting.plots", "scenario_docs": "experiments.leaderboard",
    "lecture": "course.lecture", "lab": "course.lab", "bench": "cli.bench",
}


def current_name(dotted: str) -> str:
    """``dotted`` (a module, or a module's attribute) under its current module path."""
    for old, new in MOVED.items():
        prefix = f"mooncake_gym.{old}"
        if dotted == prefix or dotted.startswith(prefix + ".") or dotted.startswith(prefix + ":"):
            return f"mooncake_gym.{new}" + dotted[len(prefix):]
    return dotted


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``mooncake_gym.OLD`` (after the real modules were looked for) and loads the new module."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname[len("mooncake_gym."):] if fullname.startswith("mooncake_gym.") else None
        if old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = "mooncake_gym." + MOVED[spec.name[len("mooncake_gym."):]]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes away in the next version",
                      DeprecationWarning, stacklevel=3)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # importlib sets __spec__ to the old name's: put it back
        return module

    def exec_module(self, module):  # the new module is already executed
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())


def renamed(old: str, new: str) -> property:
    """A read-only property ``old`` that warns and returns the attribute ``new`` (renamed in 0.2 so
    that one quantity has one name; the old name goes away in the next version)."""

    def get(self):
        warnings.warn(f"{type(self).__name__}.{old} is now {new}; the old name goes away in the next version",
                      DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    get.__name__ = old
    return property(get, doc=f"Deprecated name of ``{new}``.")
