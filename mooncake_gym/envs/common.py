"""Pieces shared by the two environments: workload arguments and argument checks."""

from __future__ import annotations

import functools
import math
import os
import struct

import gymnasium as gym
import numpy as np

from mooncake_gym.model.limits import MAX_SYNTHETIC_SESSIONS, check, check_bound, check_range  # noqa: F401  (check_range: moved)
from mooncake_gym.model.workload import Trace, as_arrivals, read_trace, resample_iid, synthetic_trace
from mooncake_gym.sim.policy import feedback_of


#: Exact types of the integer actions the environments' fast path accepts (Python's, and the numpy
#: scalars an SB3 model or ``action_space.sample()`` returns); others go through the space's check.
INTEGER_TYPES = frozenset({int, np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8})


def in_space(space, action) -> bool:
    """``space.contains(action)`` without booleans: gymnasium counts ``True`` as the integer 1, but
    an action of these environments is an integer (Python or numpy, or an integer array)."""
    if isinstance(action, (bool, np.bool_)) or getattr(action, "dtype", None) == np.bool_:
        return False
    return space.contains(action)


def check_reset_options(options, known: tuple[str, ...]) -> dict:
    """``reset``'s ``options``: None or a dict whose keys are among ``known``; ``ValueError`` naming
    an unknown key and the known ones (a misspelt key would otherwise be ignored)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"options: expected None or a dict, got {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise ValueError(f"options: unknown key {unknown[0]!r}; this environment's reset takes {', '.join(known)}")
    return options


#: The traces read from files by :func:`as_trace`, last few: {(real path, inode, size, mtime): Trace}.
#: compare, tune and the leaderboard make an env per policy and seed range on one trace file; a
#: trace is not changed after it is made, so the envs share it (and what is cached on it).
_READ: dict = {}
_READ_KEPT = 4


def as_trace(name: str, value) -> Trace:
    """A :class:`Trace` from a trace or a JSONL path (a file read once while it is unchanged);
    ``ValueError`` naming ``name`` otherwise, or if it has no requests."""
    if isinstance(value, (str, os.PathLike)):
        value = _read(value)
    elif not isinstance(value, Trace):
        raise ValueError(f"{name}: expected a path or a Trace, got {type(value).__name__}")
    if len(value) == 0:
        raise ValueError(f"{name}: expected a trace with at least one request, got an empty one")
    return value


def _read(path) -> Trace:
    try:
        st = os.stat(path)
    except OSError:
        return read_trace(path)  # (its error names the file)
    key = (os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
    trace = _READ.get(key)
    if trace is None:
        trace = read_trace(path)
        if len(_READ) >= _READ_KEPT:
            _READ.pop(next(iter(_READ)))
        _READ[key] = trace
    return trace


class ValueOrRange:
    """A positive workload parameter (a rate, a load): the same ``value`` in every episode, or one
    drawn uniformly from ``value_range = (low, high)`` per episode; ``default`` when neither is given."""

    def __init__(self, name: str, value, value_range, default: float):
        if value is not None and value_range is not None:
            raise ValueError(f"{name}, {name}_range: give one of them, not both")
        if value_range is not None:
            if not is_range(value_range):
                raise ValueError(f"{name}_range: expected (low, high), finite, with 0 < low <= high, "
                                 f"got {value_range!r}")
            for x in value_range:
                check(name, x, f"{name}_range")  # both ends in the range of mooncake_gym.model.limits
            self.value, self.range = None, (float(value_range[0]), float(value_range[1]))
        else:
            self.value, self.range = float(check(name, default if value is None else value)), None

    def draw(self, np_random: np.random.Generator) -> float:
        return self.value if self.range is None else float(np_random.uniform(*self.range))


class WorkloadSpec:
    """Where an episode's requests come from: a trace to replay, or the synthetic generator.

    ``trace``: a path or :class:`Trace` replayed whole at ``speed`` (``episode_requests`` applies to
    synthetic episodes only; cut a trace with ``Trace.head`` to shorten it).
    Otherwise each episode draws a synthetic trace from the env's ``np_random`` at ``rate`` sessions/s,
    or at a rate drawn uniformly from ``rate_range`` per episode (for training); ``episode_requests``
    requests long, or ``duration_s`` seconds of sessions when ``episode_requests`` is None.

    Opt-in (default None: as above): ``arrivals``, bursty session arrivals for the synthetic
    generator (:class:`~mooncake_gym.model.workload.BurstyArrivals` or a dict of its fields);
    ``window_requests``, with a trace: each episode replays only ``window_requests`` consecutive
    requests of it, from an offset drawn uniformly from the env's ``np_random`` (or
    ``reset(options={"offset": k})``), their arrivals shifted to start at 0; a trace of at most
    ``window_requests`` requests is replayed whole (offset 0), as a shorter ``options['trace']`` is.
    """

    def __init__(self, rate=None, rate_range=None, trace=None, speed=1.0, episode_requests=None,
                 duration_s=600.0, default_rate=4.0, arrivals=None, window_requests=None):
        check("speed", speed)
        check("requests", episode_requests, "episode_requests", allow_none=True)
        check("duration_s", duration_s)
        self.rate = ValueOrRange("rate", rate, rate_range, default_rate)
        if episode_requests is None and trace is None:  # sessions drawn per episode: bounded up front
            top = self.rate.value if self.rate.range is None else self.rate.range[1]
            check_bound("rate", top * duration_s, MAX_SYNTHETIC_SESSIONS, "sessions per episode (rate x duration_s)",
                        "lower the rate or duration_s, or set episode_requests")
        self.trace = None if trace is None else as_trace("trace", trace)
        self.speed = float(speed)
        self.episode_requests = episode_requests
        self.duration_s = float(duration_s)
        self.arrivals, self.window_requests = check_workload_shape(arrivals, window_requests, self.trace)

    def draw(self, np_random: np.random.Generator, options: dict | None) -> Trace:
        """The episode's trace: ``options['trace']`` if given, else the replayed or generated one."""
        options = check_reset_options(options, ("trace", "offset"))
        if options and "trace" in options:
            trace = as_trace("options['trace']", options["trace"])
        else:
            trace = self.trace
        if trace is not None:
            return replayed(trace, self.speed, self.window_requests, np_random, options)
        check_offset(options, self.window_requests)
        rate = self.rate.draw(np_random)
        if self.arrivals is not None:  # opt-in: the default calls below stay exactly as they were
            return synthetic_trace(np_random, rate, duration_s=None if self.episode_requests else self.duration_s,
                                   n_requests=self.episode_requests, arrivals=self.arrivals)
        if self.episode_requests is None:
            return synthetic_trace(np_random, rate, duration_s=self.duration_s)
        return synthetic_trace(np_random, rate, duration_s=None, n_requests=self.episode_requests)


def check_workload_shape(arrivals, window_requests, trace: Trace | None) -> tuple:
    """``(arrivals, window_requests)`` checked: the arrival process of a drawn workload
    (:func:`~mooncake_gym.model.workload.as_arrivals`), not with a ``trace``; the window of a replayed
    trace (a number of requests), only with one."""
    process = as_arrivals(arrivals)
    if process is not None and trace is not None:
        raise ValueError("arrivals: shapes the arrivals of a drawn workload; it has no effect with a trace")
    check("requests", window_requests, "window_requests", allow_none=True)
    if window_requests is not None and trace is None:
        raise ValueError("window_requests: replays a window of a trace; give trace= too")
    return process, window_requests


def check_offset(options: dict | None, window_requests: int | None) -> None:
    """``ValueError`` if ``options`` give an ``offset`` and there is no window to start."""
    if options and "offset" in options and window_requests is None:
        raise ValueError("options['offset']: the start of a replayed window; the env has no window_requests")


def replayed(trace: Trace, speed: float, window_requests: int | None, np_random: np.random.Generator,
             options: dict | None) -> Trace:
    """The episode's replay of ``trace``: whole, or its window of ``window_requests`` requests
    (:func:`trace_window`), at ``speed``."""
    check_offset(options, window_requests)
    if window_requests is not None:
        trace = trace_window(trace, window_requests, np_random, options)
    return trace.scaled(speed) if speed != 1.0 else trace


def trace_window(trace: Trace, window_requests: int, np_random: np.random.Generator, options: dict | None) -> Trace:
    """``window_requests`` consecutive requests of ``trace`` from an offset drawn uniformly from
    ``np_random`` (or given as ``options['offset']``), their arrivals shifted to start at 0; a trace
    of at most ``window_requests`` requests whole (offset 0, still drawn from ``np_random``)."""
    n = min(window_requests, len(trace))
    top = len(trace) - n
    if options and "offset" in options:
        offset = options["offset"]
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or not 0 <= offset <= top:
            raise ValueError(f"options['offset']: expected an integer in [0, {top}] (the trace's "
                             f"{len(trace)} requests minus the window of {n}), got {offset!r}")
    else:
        offset = int(np_random.integers(0, top + 1))
    idx = range(offset, offset + n)
    arrivals = trace.arrival_s[offset:offset + n] - trace.arrival_s[offset]
    return trace.take(idx, arrival_s=arrivals, name=f"{trace.name}[{offset}:{offset + n}]")


def episode_workload(np_random: np.random.Generator, options: dict | None, trace: Trace | None, speed: float,
                     base: Trace, episode_requests: int, load: ValueOrRange, rate_per_load: float,
                     fresh_blocks: bool = False, arrivals=None, window_requests: int | None = None
                     ) -> tuple[Trace, float]:
    """The episode's trace and load in the admission environments and the v1 environments:
    ``options['trace']`` or the env's ``trace`` replayed at ``speed`` (load NaN), whole or, with
    ``window_requests``, its window from a drawn or given ``options['offset']`` (:func:`replayed`),
    else ``episode_requests`` requests drawn i.i.d. from ``base`` with Poisson (or ``arrivals``)
    arrivals at a ``load`` drawn from ``np_random`` times ``rate_per_load`` requests/s
    (``fresh_blocks`` and ``arrivals``: see :func:`~mooncake_gym.model.workload.resample_iid`)."""
    options = check_reset_options(options, ("trace",) if window_requests is None else ("trace", "offset"))
    if options and "trace" in options:
        trace = as_trace("options['trace']", options["trace"])
    if trace is not None:
        return replayed(trace, speed, window_requests, np_random, options), float("nan")
    x = load.draw(np_random)
    return resample_iid(base, episode_requests, x * rate_per_load, np_random, fresh_blocks=fresh_blocks,
                        arrivals=arrivals), x


def is_range(value) -> bool:
    """Whether ``value`` is a pair ``(low, high)`` of finite numbers with ``0 < low <= high``
    (the check of ``rate_range`` and ``load_range``; never raises)."""
    if not isinstance(value, (tuple, list, np.ndarray)) or getattr(value, "ndim", 1) != 1 or len(value) != 2:
        return False
    if not all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
               for x in value):
        return False
    return 0 < value[0] <= value[1] < math.inf


def clip01(x: float) -> float:
    return 0.0 if x < 0.0 else (1.0 if x > 1.0 else x)


def as_float32(values: list[float]) -> np.ndarray:
    """A fresh, writable float32 array of ``values``: an observation. Packing the floats to bytes
    and wrapping them is about twice as fast as ``np.array(values, np.float32)`` for the few dozen
    features of an observation (the environments' hot path)."""
    return np.frombuffer(bytearray(_float32_packer(len(values))(*values)), np.float32)


def clipped(values: list[float]) -> list[float]:
    """``values`` each clipped to [0, 1] (NaN stays NaN)."""
    return [0.0 if x < 0.0 else (1.0 if x > 1.0 else x) for x in values]


def as_clipped_float32(values: list[float]) -> np.ndarray:
    """:func:`as_float32` of ``values`` each clipped to [0, 1]."""
    return as_float32(clipped(values))


@functools.cache
def _float32_packer(n: int):
    return struct.Struct(f"={n}f").pack


#: The render modes of both environments: a text picture, or a picture of the cluster as an RGB image
#: (``envs/viewer.py``; what video recorders and stable-baselines3's ``make_vec_env`` ask for).
#: ``gym.make(..., render_mode="human")`` shows the RGB picture in a window through gymnasium's
#: ``HumanRendering`` wrapper (needs pygame: the ``human`` extra).
RENDER_MODES = ("ansi", "rgb_array")


def check_render_mode(render_mode):
    if render_mode is not None and render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode: expected None or one of {RENDER_MODES}, got {render_mode!r}")
    return render_mode


class PicturedEnv(gym.Env):
    """The v0 environments' rendering: ``render()`` is their ``_picture()`` text with
    ``render_mode="ansi"``, their ``_frame()`` RGB array with ``"rgb_array"`` (``envs/viewer.py``),
    None without a render mode or before ``reset``."""

    metadata = {"render_modes": list(RENDER_MODES), "render_fps": 4}

    def render(self):
        if self.render_mode is None or self.sim is None:
            return None
        if self.render_mode == "ansi":
            return self._picture()
        return self._frame()


class FeedbackChannel:
    """:meth:`listen` of an environment whose episode may run on the native engine, which has no
    feedback channel. The environment gives ``_engine_steps()``, None while its episode runs on the
    reference simulator (``self.sim``) and else the steps taken on the engine, and ``_to_reference()``,
    which begins the episode drawn at ``reset`` again on the reference."""

    def listen(self, policy) -> None:
        """Tell ``policy`` each request's measured TTFT at its prefill's end (the feedback channel,
        :mod:`mooncake_gym.sim.policy`), from this episode on; call it after ``reset`` and before the
        first step. The engine has no feedback channel: an episode begun on it continues on the
        reference, which gives the same episode."""
        if feedback_of(policy) is None or self.sim is None:
            return
        steps = self._engine_steps()
        if steps is not None:
            if steps:
                raise RuntimeError("listen: call it after reset, before the episode's first step")
            self._to_reference()
        self.sim.listen(policy)


def native_or_python(engine: str | None, why: str | None) -> str:
    """The engine of an environment's episodes once ``engine`` (``"native"`` or None, resolved) is
    asked for: ``"native"`` where nothing stops it (``why`` is None), else ``"python"`` for the
    default, and for ``engine="native"`` a ``ValueError`` saying ``why``."""
    if why is None:
        return "native"
    if engine == "native":
        raise ValueError(f"engine: 'native' cannot run this environment: {why}; pass engine='python'")
    return "python"
