"""The package's layers: the module paths before 0.2 still import (the same module objects, with a
DeprecationWarning), and agent cards written before the move load unchanged."""

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

from mooncake_gym._moved import MOVED, current_name


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_new_module_and_warns(old):
    new = importlib.import_module(f"mooncake_gym.{MOVED[old]}")
    sys.modules.pop(f"mooncake_gym.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"mooncake_gym.{old} moved to mooncake_gym.{MOVED[old]}"):
        module = importlib.import_module(f"mooncake_gym.{old}")
    assert module is new and module.__spec__.name == f"mooncake_gym.{MOVED[old]}"


def test_from_import_of_an_old_module_gives_its_objects():
    sys.modules.pop("mooncake_gym.routing", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from mooncake_gym.routing import simulate as old_simulate
    from mooncake_gym.sim.routing import simulate
    assert old_simulate is simulate


def test_current_name_translates_old_dotted_paths_only():
    assert current_name("mooncake_gym.wrappers.RoutingRelativeFeatures") == \
        "mooncake_gym.envs.wrappers.RoutingRelativeFeatures"
    assert current_name("mooncake_gym.admission_features.AdmissionRuleFeatures") == \
        "mooncake_gym.envs.wrappers.AdmissionRuleFeatures"
    assert current_name("mooncake_gym.envs.wrappers.X") == "mooncake_gym.envs.wrappers.X"
    assert current_name("mooncake_gym.routingx.Y") == "mooncake_gym.routingx.Y"
    assert current_name("gymnasium.wrappers.TimeLimit") == "gymnasium.wrappers.TimeLimit"


# --- the layers (docs/architecture.md) ------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
#: The layers from the bottom up; a module imports only from its own layer and those before it.
LAYERS = [
    ("mooncake_gym._moved", "mooncake_gym._native", "mooncake_gym._files", "mooncake_gym._engine",
     "mooncake_gym._engine_native"),  # the engine switch and the native extension (C++: imports nothing)
    ("mooncake_gym.model",),
    # the simulators' bridges to the native engine (routing, its step-able interface, the cluster)
    ("mooncake_gym.sim", "mooncake_gym._engine.routing", "mooncake_gym._engine.stepper", "mooncake_gym._engine.cluster"),
    ("mooncake_gym.baselines",),
    ("mooncake_gym.analysis",),
    ("mooncake_gym.envs",),
    # the agent file format, RLlib checkpoints as agents, and the shipped agents
    ("mooncake_gym.agents.agentfile", "mooncake_gym.agents.rllib_checkpoint", "mooncake_gym.agents"),
    ("mooncake_gym.evaluation",),
    ("mooncake_gym.agents.train", "mooncake_gym.agents.warmstart", "mooncake_gym.agents.warmstart_admission",
     "mooncake_gym.agents.rllib", "mooncake_gym.agents.expert"),
    ("mooncake_gym.reporting",),
    ("mooncake_gym.experiments",),
    ("mooncake_gym.course",),
    ("mooncake_gym.cli",),
    ("mooncake_gym",),  # the package's __init__: registers the environments and scenarios
]


def library_modules() -> dict[str, Path]:
    """Every module of the library by its import name."""
    mods = {}
    for path in sorted((ROOT / "mooncake_gym").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def imports_of(name: str, path: Path, mods: dict) -> set[str]:
    """The library modules ``name`` imports anywhere in its code (function-local imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from package import submodule`` imports the submodule; any other name is the package's
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(name: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix that names ``name``'s module or package."""
    best, index = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, index = len(prefix), i
    assert index is not None, f"{name} is in no layer of LAYERS"
    return index


def test_every_import_points_down_the_layers():
    mods = library_modules()
    upward = [f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
              for name, path in mods.items() for target in sorted(imports_of(name, path, mods))
              if layer_of(target) > layer_of(name) and target != "mooncake_gym"]
    assert not upward, "\n".join(upward)


def test_the_library_has_no_import_cycle():
    mods = library_modules()
    graph = {name: imports_of(name, path, mods) - {"mooncake_gym"} for name, path in mods.items()}
    # a package imports its own submodules (re-exports); a submodule importing its package's
    # __init__ is what would close a cycle, and is counted
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(cycles)


# --- one name per quantity (issue 23 item 8) -------------------------------------------------------
def test_the_decode_capacity_has_one_name_per_quantity_and_the_old_names_warn():
    """KV tokens per decode instance: ``decode_capacity_per_instance`` on the preset, the simulator and
    the views (``decode_capacity_tokens`` is its setting on a preset or an environment); the whole
    decode pool's: ``decode_pool_capacity_tokens``. The 0.1 names still read, with a warning."""
    from mooncake_gym.model.presets import get_preset
    from mooncake_gym.model.workload import synthetic_trace
    from mooncake_gym.sim.admission import LectureAdmission, OverloadConfig
    from mooncake_gym.sim.cluster import ClusterSimulator

    p = get_preset("lecture").with_(n_decode=3, decode_capacity_tokens=200_000)
    assert p.decode_capacity_per_instance == 200_000
    trace = synthetic_trace(0, 1.0, duration_s=20)
    sim = ClusterSimulator(trace, p, engine="python")
    view = sim.reset()
    assert sim.decode_capacity_per_instance == view.decode_capacity_per_instance == 200_000
    assert view.decode_pool_capacity_tokens == 600_000
    config = OverloadConfig(n_decode=2, decode_capacity_tokens=100_000)
    admission_view = LectureAdmission(trace, config).reset()
    assert config.decode_pool_capacity_tokens == admission_view.decode_pool_capacity_tokens == 200_000
    assert admission_view.decode_capacity_per_instance == 100_000
    for thing, old, value in [(p, "capacity_tokens", 200_000), (sim, "capacity_tokens", 200_000),
                              (view, "decode_capacity_tokens", 600_000), (config, "pool_capacity_tokens", 200_000),
                              (admission_view, "decode_capacity_tokens", 200_000)]:
        with pytest.warns(DeprecationWarning, match=f"{old} is now"):
            assert getattr(thing, old) == value
