"""The built wheels: mooncake_gym/baselines/ and mooncake_gym/agents/ installed as mooncake_gym.baselines and
mooncake_gym.agents with the agents' files (design.md, issue 2), and the native engine
(docs/engine.md): the extension in the wheel built with a C++ compiler, and a pure-Python wheel
without one, whose package warns once and runs the reference.

The wheel without a compiler configures CMake only (a few seconds) and runs in ``make test``; the
one with the engine compiles it (about a minute on a busy machine): ``make check-native`` runs it
(``MOONCAKE_WHEEL_BUILD=1``)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# the one source folder, installed as is; the shipped agents' files are its only data files
PACKAGE = "mooncake_gym"
AGENT_DATA_SUFFIXES = (".zip", ".json", ".yml")
EXTENSION = "mooncake_gym/_engine_native."


def expected_wheel_files(root: Path) -> set[str]:
    """Every module of the package and the agents' data files, as wheel paths."""
    files = set()
    agents = root / PACKAGE / "agents"
    for path in (root / PACKAGE).rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix == ".py" or (path.parent == agents and path.suffix in AGENT_DATA_SUFFIXES):
            files.add(path.relative_to(root).as_posix())
    return files


def _cannot_build() -> str | None:
    """Why a wheel cannot be built offline here, or None. (A build that fails is a test failure.)"""
    for module, why in (("pip", "pip"), ("scikit_build_core", "scikit-build-core (the build backend)"),
                        ("nanobind", "nanobind (the engine's binding library)")):
        if importlib.util.find_spec(module) is None:
            return f"{why} is not installed and the build must stay offline"
    if shutil.which("cmake") is None and importlib.util.find_spec("cmake") is None:
        return "cmake is not installed"
    return None


def build_wheel(work: Path, env_extra: dict) -> tuple[Path, Path]:
    """Build the wheel from a copy of the source tree (an in-tree build writes build/ into the
    repository, where other work may be going on); returns (source copy, wheel)."""
    reason = _cannot_build()
    if reason:
        pytest.skip(f"cannot build a wheel offline: {reason}")
    source = work / "src"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
        "runs", "out", "*.so"))
    out = work / "dist"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env_extra}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index", "-v", "-w", str(out)],
        cwd=source, capture_output=True, text=True, timeout=900, env=env,
    )
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = list(out.glob("mooncake_gym-*.whl"))
    assert len(wheels) == 1, wheels
    (work / "build.log").write_text(done.stdout + done.stderr)
    return source, wheels[0]


def run_unpacked(wheel: Path, tmp_path: Path, code: str, env_extra: dict | None = None):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "MOONCAKE_GYM_ENGINE"}
    env.update(PYTHONPATH=str(site), **(env_extra or {}))
    # the development install's editable finder (scikit-build-core's, on sys.meta_path) would answer
    # for mooncake_gym before the unpacked wheel on PYTHONPATH: removed first
    prelude = "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'ScikitBuild' not in type(f).__name__]; "
    done = subprocess.run([sys.executable, "-W", "always::UserWarning", "-c", prelude + code], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return site, done


@pytest.fixture(scope="module")
def pure_wheel(tmp_path_factory):
    """The wheel built where no C++ compiler is found (CXX names none)."""
    return build_wheel(tmp_path_factory.mktemp("pure"), {"CXX": "/nonexistent/c++"})


@pytest.fixture(scope="module")
def native_wheel(tmp_path_factory):
    if os.environ.get("MOONCAKE_WHEEL_BUILD") != "1":
        pytest.skip("the wheel with the native engine compiles it (about a minute): make check-native runs it")
    return build_wheel(tmp_path_factory.mktemp("native"), {})


def check_mapped_files(source: Path, wheel: Path) -> set[str]:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mooncake_gym/baselines/__init__.py" in names
    assert "mooncake_gym/agents/__init__.py" in names
    assert not any(n.startswith(("baselines/", "agents/")) for n in names), "installed under the wrong name"
    missing = expected_wheel_files(source) - names
    assert not missing, f"source files missing from the wheel (see wheel.packages in pyproject.toml): {sorted(missing)}"
    assert not any(n.endswith((".cpp", ".hpp")) for n in names), "the engine's C++ sources are in the wheel"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "mooncake-gym = mooncake_gym.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    return names


def test_wheel_without_a_compiler_holds_the_packages_and_no_extension(pure_wheel):
    source, wheel = pure_wheel
    names = check_mapped_files(source, wheel)
    assert not any(n.startswith(EXTENSION) for n in names)
    assert "no C++ compiler found" in (wheel.parent.parent / "build.log").read_text()


def test_package_without_the_engine_warns_once_and_runs_the_reference(pure_wheel, tmp_path):
    _, wheel = pure_wheel
    code = ("import importlib, mooncake_gym; import mooncake_gym.baselines, mooncake_gym.agents; "
            "importlib.reload(mooncake_gym); print(mooncake_gym.engine()); print(mooncake_gym.__file__); "
            "print(mooncake_gym.baselines.__file__)")
    site, done = run_unpacked(wheel, tmp_path, code)
    engine, package_file, baselines_file = done.stdout.split()
    assert engine == "python" and package_file.startswith(str(site)) and baselines_file.startswith(str(site))
    assert done.stderr.count("the native engine is not built") == 1, done.stderr
    # the reference asked for: no warning
    _, quiet = run_unpacked(wheel, tmp_path / "q", "import mooncake_gym; print(mooncake_gym.engine())",
                            {"MOONCAKE_GYM_ENGINE": "python"})
    assert quiet.stdout.split() == ["python"] and "native engine" not in quiet.stderr


def test_wheel_with_a_compiler_holds_the_engine(native_wheel, tmp_path):
    source, wheel = native_wheel
    names = check_mapped_files(source, wheel)
    extensions = [n for n in names if n.startswith(EXTENSION)]
    assert len(extensions) == 1 and extensions[0].endswith(".so"), extensions
    code = ("import mooncake_gym, mooncake_gym._engine as e; print(mooncake_gym.engine()); "
            "print(e.native.__file__); print(e.stale())")
    site, done = run_unpacked(wheel, tmp_path, code)
    engine, extension, stale = done.stdout.split()
    assert engine == "native" and extension.startswith(str(site)) and stale == "False"
    assert "native engine" not in done.stderr
