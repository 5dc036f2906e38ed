"""Packaging: baselines/ and agents/ are installed as mooncake_gym.baselines and mooncake_gym.agents,
both in the development install and in a built wheel (design.md, issue 2)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# top-level source folder -> the package path it is installed under
MAPPING = {"mooncake_gym": "mooncake_gym", "baselines": "mooncake_gym/baselines", "agents": "mooncake_gym/agents"}
PACKAGE_DATA_SUFFIXES = {"agents": (".zip", ".json", ".yml")}


def expected_wheel_files(root: Path) -> set[str]:
    """Every module (and the agents' data files) under the three source folders, as wheel paths."""
    files = set()
    for folder, target in MAPPING.items():
        for path in (root / folder).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root / folder)
            if path.suffix == ".py" or (len(rel.parts) == 1 and path.suffix in PACKAGE_DATA_SUFFIXES.get(folder, ())):
                files.add(f"{target}/{rel.as_posix()}")
    return files


def test_baselines_and_agents_import_from_the_install(tmp_path):
    # run from an unrelated directory so that the repository root is not on sys.path
    code = ("import mooncake_gym.baselines as b, mooncake_gym.agents as a, mooncake_gym as m; "
            "print(m.__file__); print(b.__file__); print(a.__file__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    package, baselines, agents = (Path(p) for p in done.stdout.split())
    assert baselines.parent.name == "baselines" or baselines.parent == package.parent / "baselines"
    assert agents.parent.name == "agents" or agents.parent == package.parent / "agents"


def test_top_level_names_baselines_and_agents_are_not_claimed(tmp_path):
    """They would collide with other popular packages (design.md): the install must not provide them."""
    code = ("import importlib.util, mooncake_gym.baselines, mooncake_gym.agents\n"
            "for name in ('baselines', 'agents'):\n"
            "    spec = importlib.util.find_spec(name)\n"
            "    print(name, spec.origin if spec else None)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for row in done.stdout.splitlines():
        name, origin = row.split(" ", 1)
        assert not origin.startswith(str(REPO_ROOT)), f"top-level {name!r} resolves to {origin}"


def _can_build() -> str | None:
    """Why a wheel cannot be built here, or None. (A build that fails is a test failure, not a skip.)"""
    from importlib import metadata

    if importlib.util.find_spec("pip") is None:
        return "pip is not installed in this environment"
    try:  # read the version without importing setuptools into the test process
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return "setuptools (the build backend) is not installed and the build must stay offline"
    major, minor = (int(x) for x in version.split(".")[:2])
    if major < 68:
        return f"setuptools {version} is older than the 68 pyproject.toml asks for"
    if (major, minor) < (70, 1) and importlib.util.find_spec("wheel") is None:  # bdist_wheel moved into setuptools
        return "the wheel package is not installed and the build must stay offline"
    return None


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory):
    reason = _can_build()
    if reason:
        pytest.skip(f"cannot build a wheel offline: {reason}")
    work = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the source tree: an in-tree build writes build/ and *.egg-info into the
    # repository, where other work may be going on.
    source = work / "src"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        "runs", "out"))
    out = work / "dist"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out)],
        cwd=source, capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = list(out.glob("mooncake_gym-*.whl"))
    assert len(wheels) == 1, wheels
    return source, wheels[0]


def test_wheel_contains_baselines_and_agents(built_wheel):
    source, wheel = built_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mooncake_gym/baselines/__init__.py" in names
    assert "mooncake_gym/agents/__init__.py" in names
    assert not any(n.startswith(("baselines/", "agents/")) for n in names), "installed under the wrong name"
    missing = expected_wheel_files(source) - names
    assert not missing, f"source files missing from the wheel (add their packages to pyproject.toml): {sorted(missing)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "mooncake-gym = mooncake_gym.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_unpacked_wheel_imports_baselines_and_agents(built_wheel, tmp_path):
    _, wheel = built_wheel
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import mooncake_gym, mooncake_gym.baselines, mooncake_gym.agents; "
            "print(mooncake_gym.__file__); print(mooncake_gym.baselines.__file__)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    package_file, baselines_file = done.stdout.split()
    assert package_file.startswith(str(site)) and baselines_file.startswith(str(site))
