"""Which engine runs the simulators: the native one (C++17, ``mooncake_gym._engine_native``, built
from this folder's ``*.cpp`` and ``*.hpp`` at install) or the Python reference (docs/engine.md).

:func:`engine` names the default: ``"native"`` when the extension imports, ``"python"`` when it
does not (an install with no C++ compiler: :func:`warn_if_missing` says so once) or when the
environment variable ``MOONCAKE_GYM_ENGINE=python`` asks for the reference. :func:`resolve` turns a
simulator's ``engine=`` argument into one of the two names. This module imports nothing of the
package (layer 0); the routing simulator's bridge to the extension is :mod:`mooncake_gym._engine.routing`.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from pathlib import Path

ENGINES = ("native", "python")
#: The environment variable that chooses the default engine (``native`` or ``python``).
ENV_VAR = "MOONCAKE_GYM_ENGINE"

try:
    native = importlib.import_module("mooncake_gym._engine_native")
    _import_error: ImportError | None = None
except ImportError as e:  # not built: no compiler at install, or a source tree never installed
    native = None
    _import_error = e

_warned = False


def available() -> bool:
    """Whether the native extension imported."""
    return native is not None


def _checked(name: str, where: str) -> str:
    """``name`` if it is an engine that can run here; else a ``ValueError`` naming ``where``."""
    if name not in ENGINES:
        raise ValueError(f"{where}: expected one of {ENGINES}, got {name!r}")
    if name == "native" and native is None:
        raise ValueError(f"{where}: the native engine is not built here ({_import_error}); install with a C++ "
                         "compiler (make install, or pip install -e .), or use 'python'")
    return name


def engine() -> str:
    """The default engine's name: ``"native"`` or ``"python"`` (``MOONCAKE_GYM_ENGINE`` decides if
    set; otherwise native where the extension is built)."""
    chosen = os.environ.get(ENV_VAR, "")
    if chosen:
        return _checked(chosen, ENV_VAR)
    return "native" if native is not None else "python"


def resolve(engine_arg: str | None) -> str:
    """A simulator's ``engine=`` argument as ``"native"`` or ``"python"`` (None: :func:`engine`).
    ``"native"`` without the extension is a ``ValueError`` saying how to build it."""
    return engine() if engine_arg is None else _checked(engine_arg, "engine")


def sources_fingerprint(folder: Path | None = None) -> str | None:
    """The fingerprint of the C++ sources in ``folder`` (default: beside this file), computed as
    CMakeLists.txt computes the one it compiles in (SHA-256 of the files' SHA-256 digests in sorted
    order); None where the folder holds no sources (an installed wheel)."""
    folder = Path(__file__).resolve().parent if folder is None else folder
    files = sorted(p for p in folder.iterdir() if p.suffix in (".cpp", ".hpp"))
    if not files:
        return None
    # CMake sorts the full paths; in one folder that is the order of the names
    digests = "".join(hashlib.sha256(p.read_bytes()).hexdigest() for p in files)
    return hashlib.sha256(digests.encode()).hexdigest()


def stale() -> bool:
    """Whether the built extension was compiled from other C++ sources than those beside this file
    (an editable install after an edit of the engine, before a rebuild)."""
    if native is None:
        return False
    here = sources_fingerprint()
    return here is not None and here != getattr(native, "FINGERPRINT", here)


def warn_if_missing() -> None:
    """Warn once per process when the default engine falls back to the reference because the
    extension is not built, or when the extension is older than its sources."""
    global _warned
    if _warned:
        return
    _warned = True
    if native is None and os.environ.get(ENV_VAR, "") != "python":
        warnings.warn(f"mooncake_gym: the native engine is not built ({_import_error}); the Python reference "
                      f"runs (mooncake_gym.engine() == 'python'). Install with a C++ compiler to build it "
                      f"(make install, or pip install -e .); set {ENV_VAR}=python to silence this.", stacklevel=3)
    elif stale():
        warnings.warn("mooncake_gym: the native engine was built from other sources than mooncake_gym/_engine/ "
                      "holds now; rebuild it with `make engine` (or pip install -e .)", stacklevel=3)
