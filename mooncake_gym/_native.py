"""Compiled or not: :func:`compiled` (the compiled modules in use), :func:`warn_if_stale`, and
``mypyc_attr`` for the modules that ``MOONCAKE_GYM_COMPILE=1`` compiles (setup.py): mypyc reads it
when compiling; at run time, without mypy installed, it is a decorator that changes nothing.

``@mypyc_attr(native_class=False)`` keeps a class an ordinary Python class when its module is
compiled (its methods are still compiled): classes with a ``cached_property``, frozen dataclasses,
subclasses of classes from other packages. Pure Python ignores it.
"""

from __future__ import annotations

import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # pure Python without mypy: nothing to mark

        def mypyc_attr(*attrs: str, **kwattrs: Any) -> Callable[[Any], Any]:
            return lambda x: x


def _extensions() -> dict[str, Path]:
    """``{module name: extension file}`` of the compiled modules next to the package's .py files."""
    root = Path(__file__).resolve().parent
    found = {}
    for path in root.rglob("*.*"):
        suffix = next((s for s in EXTENSION_SUFFIXES if path.name.endswith(s)), None)  # the longest first
        if suffix is None or path.name.endswith("__mypyc" + suffix):  # not one, or the group's shared library
            continue
        rel = path.relative_to(root).as_posix()[: -len(suffix)].replace("/", ".")
        found[f"{__package__}.{rel}"] = path
    return found


def compiled() -> list[str]:
    """The modules of the package that run compiled (``make install-fast``; setup.py), sorted; [] when
    everything runs as pure Python (the default install)."""
    return sorted(name for name in _extensions()  # (mypyc's __file__ may name another folder: not compared)
                  if str(getattr(sys.modules.get(name), "__file__", "")).endswith(tuple(EXTENSION_SUFFIXES)))


def _source(extension: Path) -> Path:
    return extension.with_name(extension.name.split(".", 1)[0] + ".py")


def warn_if_stale() -> None:
    """Warn when a compiled module's .py was edited after it was compiled: the extension shadows it,
    so the edit does not run until ``make install-fast`` (rebuild) or ``make clean-compiled`` (pure
    Python; ``make clean`` would also remove the venv)."""
    extensions = _extensions()
    # a module's extension is rebuilt only when its shim changes: the build's time is the newest file
    built = max((path.stat().st_mtime for path in Path(__file__).resolve().parent.glob("*__mypyc.*")), default=0.0)
    stale = [name for name, path in extensions.items()
             if _source(path).exists() and _source(path).stat().st_mtime > max(built, path.stat().st_mtime)]
    if stale:
        warnings.warn(f"mooncake_gym: {', '.join(sorted(stale))} changed since compiled; the compiled version runs. "
                      f"Rebuild (make install-fast) or remove the compiled modules (make clean-compiled).", stacklevel=3)
