"""A student's policy run in a child process: the grader's side of the pipe and the child's.

:class:`SandboxedPolicy` is a policy (``policy(view) -> action``, ``reset(rng)``) whose code runs
in a child Python process, so that nothing the submission does can end or hang the grader:

- the child starts in a scratch working directory (removed afterwards), with an environment of
  only what Python needs, no file descriptors but the pipe, in its own process group;
- its limits: an address space of ``memory_mb``, files of size 0 (``RLIMIT_FSIZE``: it cannot
  write data to any file), CPU seconds of ``total_s``; wall-clock time per episode
  (``episode_s``) and in all (``total_s``), counted by the grader;
- the submission's source is read by the grader and sent through the pipe; the child never
  opens it. Its standard input and output are ``/dev/null`` (the pipe is a pair of other
  descriptors), so a ``print`` cannot corrupt the protocol;
- the pipe carries JSON lines only: a view's fields (and its properties, evaluated by the grader)
  one way, an action (an integer, a boolean or a pair) or a failure the other. A view's methods
  (``RoutingView.ttft_s``, ``AdmissionView.project_decode``) are called back in the grader with
  JSON numbers as arguments. A line from the child is at most :data:`MAX_LINE_BYTES`.

Every way a submission can fail (an import error, an exception, ``sys.exit``, ``os._exit``, a
loop, a memory blow-up, an answer that is not JSON) raises :class:`SubmissionFailed` with the
reason; the grader reports it as the submission's result.

- on Linux 5.13 and later, before the submission's code runs, the child confines itself with
  Landlock (the kernel's unprivileged access control, ``landlock(7)``): it may read and execute
  only below Python's own folders (the standard library, the venv and its site-packages) and the
  system's library folders, read the installed ``mooncake_gym`` package, and
  create, change and delete files only in its scratch folder. Reading anything else (the
  grader's files, a home folder, the other students' submissions) or deleting anything outside
  the scratch folder fails with ``PermissionError``. Where the kernel's Landlock ABI has them it
  also may not bind or connect TCP sockets (ABI 4), nor signal processes or reach abstract Unix
  sockets outside its own domain (ABI 6). :attr:`SandboxedPolicy.confinement` says what held.

What it does not do: where Landlock is missing (older kernels, other systems) the file-system
confinement does not hold and the child can read what the grader's user can read and delete what
that user may delete; ``confinement`` is then ``"none"`` and the grader says so. Landlock does not
restrict UDP or non-abstract Unix sockets (before ABI 6 nor any socket but TCP). For a hostile
class, run the grader under its own user or in a container as well.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The longest line the child may send (an action, a call, a failure): 1 MiB.
MAX_LINE_BYTES = 1 << 20
#: Seconds the child may take to start and import the submission.
START_S = 60.0


class SubmissionFailed(RuntimeError):
    """The submission failed; the message is the reason, for the grade."""


@dataclass(frozen=True)
class Limits:
    """The child's limits: wall-clock seconds per episode and in all, and memory in MB."""

    episode_s: float = 120.0
    total_s: float = 1800.0
    memory_mb: int = 2048

    def __post_init__(self):
        for name in ("episode_s", "total_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 86400):
                raise ValueError(f"{name}: expected seconds in (0, 86400], got {value!r}")
        if not (isinstance(self.memory_mb, int) and not isinstance(self.memory_mb, bool) and 64 <= self.memory_mb <= 65536):
            raise ValueError(f"memory_mb: expected an integer in [64, 65536], got {self.memory_mb!r}")


def _jsonable(x: Any) -> Any:
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (tuple, list, np.ndarray)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    raise TypeError(f"{type(x).__name__} is not sent to a sandboxed policy")


def encode_view(view: Any) -> dict:
    """A view as JSON: its fields (a named tuple's, but the simulator behind it), the values of its
    class's properties, and the names of its public methods."""
    cls = type(view)
    fields = {k: v for k, v in zip(getattr(cls, "_fields", ()), view) if k != "simulator"}
    methods = []
    for name in dir(cls):
        if name.startswith("_") or name in fields:
            continue
        attr = getattr(cls, name)
        if isinstance(attr, property):
            fields[name] = getattr(view, name)
        elif callable(attr) and name not in ("count", "index") and not isinstance(attr, (staticmethod, classmethod)):
            methods.append(name)
    return {"fields": _jsonable(fields), "methods": methods}


def _source_of(spec: str) -> tuple[str, str, str]:
    """``(source, file name, function)`` of ``module:function`` or ``path/file.py:function``."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"--policy: expected module:function or path/file.py:function, got {spec!r}")
    module, _, function = spec.rpartition(":")
    if module.endswith(".py"):
        path = Path(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as e:
            raise ValueError(f"--policy: cannot find module {module!r}: {e}") from None
        if found is None:
            raise ValueError(f"--policy: cannot import {module!r}: no module of that name")
        if not found.origin or not found.origin.endswith(".py"):
            raise ValueError(f"--policy: no Python source for module {module!r}")
        path = Path(found.origin)
    if not path.is_file():
        raise ValueError(f"--policy: no file {path}")
    if path.stat().st_size > 10 << 20:
        raise ValueError(f"--policy: {path} is larger than 10 MB")
    try:
        return path.read_text(encoding="utf-8"), str(path), function
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--policy: cannot read {path}: {e}") from None


class SandboxedPolicy:
    """The policy ``spec`` (``module:function`` or ``path/file.py:function``) in a child process
    within ``limits``; ``close()`` (or the end of a ``with`` block) ends the child."""

    def __init__(self, spec: str, limits: Limits = Limits(), name: str | None = None):
        source, filename, function = _source_of(spec)
        self.name = name or function
        self.limits = limits
        self._spent = 0.0
        self._episode = 0.0
        self._view, self._methods = None, []
        self._scratch = tempfile.mkdtemp(prefix="mooncake-gym-submission-")
        memory = limits.memory_mb << 20
        cpu = int(limits.total_s) + 5

        def confine():  # in the child, before it runs Python
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails with an error instead

        env = {"PATH": os.defpath, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        # this file run as a script, isolated (-I: no environment variables, no user site, not the
        # current folder) and without bytecode files (-B): the child imports only what it needs
        self._proc = subprocess.Popen([sys.executable, "-I", "-B", __file__],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      cwd=self._scratch, env=env, close_fds=True, preexec_fn=confine,
                                      start_new_session=True)
        self._buffer = b""
        #: what confined the child's file system: ``"landlock ABI N"`` or ``"none"`` (module docstring)
        self.confinement = "none"
        self._send({"source": source, "filename": filename, "function": function,
                    "read": readable_folders(), "write": [self._scratch]})
        self._receive(deadline=time.monotonic() + START_S, expect="ready", what="while importing the submission")

    # -- the policy interface --------------------------------------------------------------------
    def reset(self, rng: np.random.Generator) -> None:
        """A new episode: its time budget restarts; the submission's ``reset(rng)`` (if it has one)
        gets a generator in the same state as ``rng``."""
        self._episode = 0.0
        self._send({"reset": _jsonable(rng.bit_generator.state)})
        self._receive(self._deadline(), expect="ready", what="in reset")

    def __call__(self, view):
        encoded = encode_view(view)
        self._view, self._methods = view, encoded["methods"]
        self._send({"view": encoded})
        return self._receive(self._deadline(), expect="action", what="deciding")

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            stream.close()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the pipe --------------------------------------------------------------------------------
    def _deadline(self) -> float:
        left = min(self.limits.episode_s - self._episode, self.limits.total_s - self._spent)
        return time.monotonic() + max(left, 0.0)

    def _fail(self, reason: str):
        self.close()
        raise SubmissionFailed(reason)

    def _send(self, message: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._fail(self._ended())

    def _ended(self) -> str:
        code = self._proc.wait()
        if code < 0 and -code == signal.SIGXCPU:
            return f"it used more than {self.limits.total_s:g} s of CPU time"
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"its process ended ({how}; a crash, os._exit, or memory beyond {self.limits.memory_mb} MB)"

    def _line(self, deadline: float) -> bytes:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0.0))[0] if left > 0 else []
            if not ready:
                limit = "episode" if self.limits.episode_s - self._episode <= self.limits.total_s - self._spent else "grading"
                seconds = self.limits.episode_s if limit == "episode" else self.limits.total_s
                self._fail(f"it ran past the time limit of {seconds:g} s per {limit}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self._fail(self._ended())
            self._buffer += chunk
            if len(self._buffer) > MAX_LINE_BYTES and b"\n" not in self._buffer:
                self._fail(f"it sent a line longer than {MAX_LINE_BYTES} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _receive(self, deadline: float, expect: str, what: str):
        start = time.monotonic()
        try:
            while True:
                try:
                    message = json.loads(self._line(deadline))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    self._fail(f"{what}: its answer is not JSON")
                if not isinstance(message, dict):
                    self._fail(f"{what}: its answer is not a JSON object")
                if "error" in message:
                    self._fail(f"{what}: {str(message['error'])[:500]}")
                if "call" in message:  # a method of the view, run here
                    self._send({"result": self._call(message)})
                    continue
                if expect == "ready" and message.get("ready") is True:
                    if isinstance(message.get("confinement"), str):
                        self.confinement = message["confinement"][:100]
                    return None
                if expect == "action" and "action" in message:
                    action = message["action"]
                    return tuple(action) if isinstance(action, list) else action
                self._fail(f"{what}: unexpected answer {str(message)[:200]}")
        finally:
            spent = time.monotonic() - start
            self._spent += spent
            self._episode += spent

    def _call(self, message: dict):
        name, args = message.get("call"), message.get("args", [])
        if name not in self._methods or not isinstance(args, list) or len(args) > 8 or \
                not all(isinstance(a, (int, float, bool)) or a is None for a in args):
            self._fail(f"deciding: it called view.{str(name)[:50]} with arguments the view does not take")
        try:
            return _jsonable(getattr(self._view, name)(*args))
        except (TypeError, ValueError) as e:
            return {"__error__": f"{type(e).__name__}: {e}"}


def readable_folders() -> list[str]:
    """The folders a confined child may read below: Python's (standard library, prefixes,
    site-packages), the system's library folders, and the folders of the packages a submission may
    import from this project."""
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/usr/share/zoneinfo"}
    folders.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    for package in ("mooncake_gym", "numpy"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            folders.update(spec.submodule_search_locations)
    return sorted(f for f in folders if os.path.isdir(f))


# Landlock (linux/landlock.h): the system calls (the same numbers on every architecture) and rights.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_FS_EXECUTE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
#: every file-system right of each ABI version: 13 in ABI 1, then REFER (2), TRUNCATE (3), IOCTL_DEV (5)
_FS_ALL = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 where there is none: not Linux, before 5.13, or
    disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(int(libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))), 0)


def confine_files(read: list[str], write: list[str]) -> str:
    """Confine this process with Landlock: read and execute below ``read``, every right below
    ``write``, nothing elsewhere (and no TCP, signals or abstract sockets outside, where the ABI
    has them). Returns ``"landlock ABI N"``, or ``"none"`` where the kernel has no Landlock."""
    abi = landlock_abi()
    if abi < 1:
        return "none"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fs_all = _FS_ALL[min(abi, 5)]
    attr = _RulesetAttr(fs_all, _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0,
                        _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for folders, rights in ((read, _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR), (write, fs_all)):
            for folder in folders:
                try:
                    fd = os.open(folder, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)
                except OSError:
                    continue  # a folder that is not there: nothing to allow
                try:
                    rule = _PathBeneathAttr(rights, fd)
                    if libc.syscall(_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1),
                                    ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule failed on {folder}")
                finally:
                    os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
                libc.syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return f"landlock ABI {abi}"


# -- the child -------------------------------------------------------------------------------------
class _View:
    """The child's view: the fields as attributes (lists as tuples), the methods called back."""

    def __init__(self, encoded: dict, call):
        for key, value in encoded["fields"].items():
            object.__setattr__(self, key, _tuples(value))
        for name in encoded["methods"]:
            object.__setattr__(self, name, lambda *args, _name=name: call(_name, args))

    def __setattr__(self, name, value):
        raise AttributeError("the view is read-only")


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def child() -> None:
    """The child's loop: this file run as a script by :class:`SandboxedPolicy`."""
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)

    def send(message: dict) -> None:
        proto_out.write(json.dumps(message).encode() + b"\n")
        proto_out.flush()

    def receive() -> dict:
        line = proto_in.readline()
        if not line:
            os._exit(0)
        return json.loads(line)

    def call(name, args):
        send({"call": name, "args": [_jsonable(a) for a in args]})
        result = receive()["result"]
        if isinstance(result, dict) and "__error__" in result:
            raise ValueError(result["__error__"])
        return _tuples(result)

    def guarded(what, fn, *args):
        try:
            return fn(*args)
        except SystemExit as e:
            send({"error": f"{what} called sys.exit({e.code!r})"})
        except BaseException as e:  # noqa: BLE001 -- the submission's failure, reported
            send({"error": f"{what} raised {type(e).__name__}: {e}"})
        os._exit(1)

    start = receive()
    try:
        confinement = confine_files(start["read"], start["write"])
    except OSError as e:
        send({"error": f"the sandbox could not confine the submission: {e}"})
        os._exit(1)
    namespace: dict = {"__name__": "submission", "__file__": start["filename"]}
    guarded("importing the submission", lambda: exec(compile(start["source"], start["filename"], "exec"), namespace))
    policy = namespace.get(start["function"])
    if not callable(policy):
        send({"error": f"the submission has no function {start['function']!r}"})
        os._exit(1)
    send({"ready": True, "confinement": confinement})
    while True:
        message = receive()
        if "reset" in message:
            reset = getattr(policy, "reset", None)
            if callable(reset):
                state = message["reset"]
                bit_generator = getattr(np.random, state["bit_generator"])()
                bit_generator.state = state
                guarded("reset", reset, np.random.Generator(bit_generator))
            send({"ready": True})
        else:
            action = guarded("the policy", policy, _View(message["view"], call))
            try:
                send({"action": _jsonable(action)})
            except TypeError:
                send({"error": f"the policy answered {type(action).__name__} {str(action)[:100]!r}, not an action"})


if __name__ == "__main__":
    child()
