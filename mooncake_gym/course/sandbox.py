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

What it does not do: it is not a security boundary against a determined attacker (the child
runs as the grader's user and can read what that user can read, and delete files that user may
delete); run untrusted submissions under their own user or in a container for that.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
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
        import importlib.util

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
        self._send({"source": source, "filename": filename, "function": function})
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
    namespace: dict = {"__name__": "submission", "__file__": start["filename"]}
    guarded("importing the submission", lambda: exec(compile(start["source"], start["filename"], "exec"), namespace))
    policy = namespace.get(start["function"])
    if not callable(policy):
        send({"error": f"the submission has no function {start['function']!r}"})
        os._exit(1)
    send({"ready": True})
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
