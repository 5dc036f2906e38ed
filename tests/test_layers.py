"""The package's layers: the module paths before 0.2 still import (the same module objects, with a
DeprecationWarning), and agent cards written before the move load unchanged."""

import importlib
import sys
import warnings

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
        "mooncake_gym.envs.admission_features.AdmissionRuleFeatures"
    assert current_name("mooncake_gym.envs.wrappers.X") == "mooncake_gym.envs.wrappers.X"
    assert current_name("mooncake_gym.routingx.Y") == "mooncake_gym.routingx.Y"
    assert current_name("gymnasium.wrappers.TimeLimit") == "gymnasium.wrappers.TimeLimit"


@pytest.mark.parametrize("layer, allowed", [("model", {"model", "_native"}), ("sim", {"model", "sim", "_native"})])
def test_the_core_imports_nothing_above_it(layer, allowed):
    # every import of the package in model/ and sim/, function-local ones included, points down
    import ast
    from pathlib import Path

    import mooncake_gym

    for path in sorted((Path(mooncake_gym.__file__).parent / layer).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for name in names:
                if name.startswith("mooncake_gym."):
                    assert name.split(".")[1] in allowed, f"{path.name} imports {name}"
