"""Files written whole or not at all, and inputs that must be regular files.

Every file the package produces goes through :func:`replacing` (or :func:`write_atomic`): it is
written to a temporary file in the target's folder and moved over the target with ``os.replace``
only once complete, so a failure midway (an error, Ctrl-C, a full disk) leaves the old file as it
was and no partial one. :func:`check_input_file` says what a path is when it is not a readable
regular file (missing, a directory, a FIFO, a device), before anything opens it;
:func:`check_output_file` says why a file cannot be written at a path, before the work that makes it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_input_file(path: str | os.PathLike, what: str) -> None:
    """``FileNotFoundError`` if nothing is at ``path``, ``ValueError`` naming what it is if it is not
    a regular file; ``what`` names the input (``trace``, ``agent``)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: no such file {os.fspath(path)!r}") from None
    except OSError as e:
        raise ValueError(f"{what}: cannot read {os.fspath(path)!r} ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise ValueError(f"{what}: {os.fspath(path)!r} is {kind}, not a file")


def check_output_file(path: str | os.PathLike, what: str, suffixes: tuple = ()) -> str:
    """``path`` if a file can be written there: a name ending in one of ``suffixes`` (any, if
    empty), not an existing directory, FIFO or device, in a folder that exists and is writable
    (nothing is created: a command refused leaves no trace). ``ValueError`` naming ``what`` (the option) otherwise."""
    name = os.fspath(path)
    if not name or name.endswith(os.sep):
        raise ValueError(f"{what}: expected a file name, got {name!r}")
    if suffixes and not name.lower().endswith(tuple(suffixes)):
        raise ValueError(f"{what}: expected a file name ending in {' or '.join(suffixes)}, got {name!r}")
    if os.path.lexists(name):
        mode = os.stat(name).st_mode if os.path.exists(name) else stat.S_IFREG
        if not stat.S_ISREG(mode):
            kind = next((kind for test, kind in _KINDS if test(mode)), "not a regular file")
            raise ValueError(f"{what}: {name!r} is {kind}, not a file")
    folder = os.path.dirname(name) or "."
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{what}: the folder {folder!r} is not a directory")
    if not os.path.isdir(folder):
        raise ValueError(f"{what}: no such directory {folder!r}")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{what}: the folder {folder!r} is not writable")
    return name


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; moved over ``path`` when the block ends without
    an exception, removed otherwise."""
    path = Path(path)
    check_output_file(path, "output")  # says what is wrong with the target, not with the temporary file
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all (:func:`replacing`)."""
    with replacing(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
