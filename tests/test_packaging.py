"""Packaging: baselines/ and agents/ are installed as mooncake_gym.baselines and mooncake_gym.agents
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
    assert baselines.parent.name == "baselines" or baselines.parent == package.parent / "baselines"
    assert agents.parent.name == "agents" or agents.parent == package.parent / "agents"


def test_top_level_names_baselines_and_agents_give_way_to_installed_packages(tmp_path):
    """They would collide with other popular packages (design.md). A wheel install does not provide
    them (tests/test_engine_build.py). The editable install (scikit-build-core's redirect mode) puts
    each mapped folder's parent on sys.path, so there the repository root is on it, but after
    site-packages: an installed package of either name is found first."""
    code = ("import importlib.util, site, sys, mooncake_gym.baselines, mooncake_gym.agents\n"
            "sites = [sys.path.index(p) for p in site.getsitepackages() if p in sys.path]\n"
            "for name in ('baselines', 'agents'):\n"
            "    spec = importlib.util.find_spec(name)\n"
            "    print(name, spec.origin if spec else None, min(sites))\n"
            f"print('root', sys.path.index({str(REPO_ROOT)!r}) if {str(REPO_ROOT)!r} in sys.path else 'absent')")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *rows, root = done.stdout.splitlines()
    for row in rows:
        name, origin, first_site = row.split(" ")
        if origin.startswith(str(REPO_ROOT)):
            assert root.split()[1] != "absent" and int(root.split()[1]) > int(first_site), \
                f"top-level {name!r} resolves to {origin} ahead of site-packages"


# The built wheels (with the native engine, and without a C++ compiler): tests/test_engine_build.py
