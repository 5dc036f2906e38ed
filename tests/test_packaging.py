"""Packaging: mooncake_gym.baselines and mooncake_gym.agents are subpackages of the one installed package
in the development install (design.md, issue 2); in a built wheel: tests/test_engine_build.py."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_baselines_and_agents_import_from_the_install(tmp_path):
    # run from an unrelated directory so that the repository root is not on sys.path
    code = ("import mooncake_gym.baselines as b, mooncake_gym.agents as a, mooncake_gym as m; "
            "print(m.__file__); print(b.__file__); print(a.__file__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    package, baselines, agents = (Path(p) for p in done.stdout.split())
    assert baselines.parent == package.parent / "baselines"
    assert agents.parent == package.parent / "agents"


def test_top_level_names_baselines_and_agents_are_not_the_projects(tmp_path):
    """They would collide with other popular packages (design.md): the project installs only
    ``mooncake_gym``, so in the development install neither name resolves into the repository
    (a wheel install: tests/test_engine_build.py)."""
    code = ("import importlib.util, mooncake_gym.baselines, mooncake_gym.agents\n"
            "for name in ('baselines', 'agents'):\n"
            "    spec = importlib.util.find_spec(name)\n"
            "    print(name, spec.origin if spec else None)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = dict(row.split(" ", 1) for row in done.stdout.splitlines())
    assert set(rows) == {"baselines", "agents"}
    for name, origin in rows.items():
        assert not origin.startswith(str(REPO_ROOT)), f"top-level {name!r} resolves to {origin} in the repository"


# The built wheels (with the native engine, and without a C++ compiler): tests/test_engine_build.py
