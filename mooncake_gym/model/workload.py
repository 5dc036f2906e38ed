"""Workloads: requests, traces in Mooncake's JSONL format, a synthetic generator and i.i.d. resampling.

A trace line (Mooncake FAST'25 trace release, see ``shared/traces/README.md``)::

    {"timestamp": 277, "input_length": 32140, "output_length": 92, "hash_ids": [198, 199, ...]}

``timestamp`` is the arrival in milliseconds; ``hash_ids`` has one id per 512-token block of the
prompt and an id names a block *together with every block before it* (prefix hashing), so two
requests can reuse KV for exactly their common leading ids. We also write and read an optional
``session_id`` field (other readers ignore it).
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Iterable, Iterator, Sequence

import numpy as np

from mooncake_gym import _engine
from mooncake_gym._files import check_input_file, write_atomic
from mooncake_gym.model.costmodel import BLOCK_TOKENS
from mooncake_gym.model.limits import LIMITS, MAX_ID, MAX_INPUT_TOKENS, MAX_SYNTHETIC_SESSIONS, check, check_bound, check_range
from mooncake_gym.model.traceformats import PREFIX_RULES, TraceFormat, TraceFormatError, parse_format, read_columns

#: A Mooncake JSONL line's required fields; ``hash_ids`` may be left out of every line (then the
#: ids are made by a rule: :func:`derived_block_ids`), ``session_id`` is optional.
REQUIRED_FIELDS = ("timestamp", "input_length", "output_length")
#: Where a trace's prefix block ids come from: its own file (``"trace"``: Mooncake's ``hash_ids``,
#: or a generator's), or one of :data:`PREFIX_RULES` for a source without them.
PREFIX_SOURCES = ("trace", *PREFIX_RULES)


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request: arrival time (s), prompt and output lengths (tokens), prefix block ids."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...]
    session_id: int = -1


def repeated_id(block_ids: Sequence[int]) -> int | None:
    """The first block id that ``block_ids`` holds twice, or None. A hash id names a block together
    with every block before it (prefix hashing), so one request's ids are distinct; a request
    holding one twice would make the prefix caches wrong (the reader and ``Trace`` refuse it)."""
    if len(set(block_ids)) == len(block_ids):
        return None
    seen: set[int] = set()
    return next(b for b in block_ids if b in seen or seen.add(b))


class Trace:
    """An ordered collection of requests, stored column-wise.

    Columns: ``arrival_s`` (float64, non-decreasing), ``input_tokens`` and ``output_tokens``
    (int64), ``session_ids`` (int64, -1 where unknown) and ``block_ids`` (a list of tuples of int).
    ``taken_from`` is ``(trace, indices)`` for a trace made by :meth:`take` with the blocks of those
    rows (the engine reads it from that trace's columns), else None.
    """

    __slots__ = ("arrival_s", "input_tokens", "output_tokens", "_blocks", "_flat", "session_ids", "name",
                 "renamed_blocks", "prefix_ids", "taken_from", "_columns")

    def __init__(self, arrival_s, input_tokens, output_tokens, block_ids, session_ids=None, name="trace",
                 prefix_ids: str = "trace"):
        """Columns are validated here (ranges of ``mooncake_gym.model.limits``): finite non-decreasing
        arrivals >= 0, integer token counts and ids in range, distinct ids within a request.

        Block ids that are not prefix hashes (an id seen after two different predecessors) are
        normalised to prefix semantics: see :func:`prefix_block_ids`; ``renamed_blocks`` counts the
        block occurrences that got a new id (0 for Mooncake's traces). ``prefix_ids`` says where the
        ids come from (:data:`PREFIX_SOURCES`): the trace itself, or a rule for a source without
        them (:func:`derived_block_ids`)."""
        if prefix_ids not in PREFIX_SOURCES:
            raise ValueError(f"prefix_ids: expected one of {list(PREFIX_SOURCES)}, got {prefix_ids!r}")
        arrivals = _float_column("arrival_s", arrival_s)
        n = len(arrivals)
        lengths = {len(arrivals), _length(input_tokens), _length(output_tokens), _length(block_ids),
                   n if session_ids is None else _length(session_ids)}
        if lengths != {n}:
            raise ValueError(f"Trace columns have different lengths: {sorted(lengths | {n})}")
        if n and np.any(np.diff(arrivals) < 0):
            raise ValueError("arrival_s: arrivals must be non-decreasing")
        blocks = _block_column(block_ids)
        for i, ids in enumerate(blocks):
            if repeated_id(ids) is not None:
                raise ValueError(f"block_ids: request {i} holds an id twice ({list(ids)}); the block ids of "
                                 f"one request are distinct (an id names a block with everything before it)")
        blocks, renamed = prefix_block_ids(blocks)
        self._set(
            arrivals,
            _int_column("input_tokens", input_tokens, "input_length"),
            _int_column("output_tokens", output_tokens, "output_length"),
            blocks,
            np.full(n, -1, dtype=np.int64) if session_ids is None else _int_column("session_ids", session_ids,
                                                                                  "session_id"),
            name,
            renamed,
            prefix_ids,
        )

    def _set(self, arrival_s, input_tokens, output_tokens, block_ids, session_ids, name, renamed_blocks=0,
             prefix_ids="trace", flat=None):
        for column in (arrival_s, input_tokens, output_tokens, session_ids):
            column.flags.writeable = False  # validated once: the columns cannot be changed afterwards
        self.arrival_s, self.input_tokens, self.output_tokens = arrival_s, input_tokens, output_tokens
        if flat is not None:
            for column in flat:
                column.flags.writeable = False
        self._blocks, self._flat = block_ids, flat
        self.taken_from = None
        self._columns = None
        self.session_ids, self.name = session_ids, name
        self.renamed_blocks = renamed_blocks
        self.prefix_ids = prefix_ids

    def __getstate__(self) -> dict:
        """The columns and attributes, without the lists :meth:`columns` keeps (made again when read)."""
        return {k: getattr(self, k) for k in self.__slots__ if k != "_columns" and hasattr(self, k)}

    def __setstate__(self, state) -> None:
        if isinstance(state, tuple):  # (None, slots): a trace pickled before __getstate__ existed
            state = state[1]
        for k, v in state.items():
            setattr(self, k, v)
        if "taken_from" not in state:
            self.taken_from = None
        self._columns = None

    @property
    def block_ids(self) -> list[tuple[int, ...]]:
        """Each request's block ids, a tuple per request. A generated trace keeps them as one flat
        column (:attr:`flat_blocks`) and makes the tuples when they are first read."""
        if self._blocks is None:
            starts, ids = self._flat
            flat = ids.tolist()
            self._blocks = [tuple(flat[a:e]) for a, e in zip(starts[:-1].tolist(), starts[1:].tolist())]
        return self._blocks

    @block_ids.setter
    def block_ids(self, value) -> None:
        self._blocks, self._flat = value, None
        self.taken_from = None  # (its blocks are no longer the base trace's)
        self._columns = None

    @property
    def flat_blocks(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(starts, ids)``, int64: request k's block ids are ``ids[starts[k]:starts[k + 1]]``, where
        the trace was made with them so (the synthetic generator: the engine reads them without the
        tuples); None otherwise."""
        return self._flat

    @classmethod
    def from_requests(cls, requests: Iterable[Request], name: str = "trace") -> "Trace":
        rs = list(requests)
        return cls(
            [r.arrival_s for r in rs],
            [r.input_tokens for r in rs],
            [r.output_tokens for r in rs],
            [r.block_ids for r in rs],
            [r.session_id for r in rs],
            name=name,
        )

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __getitem__(self, i: int) -> Request:
        return Request(
            float(self.arrival_s[i]),
            int(self.input_tokens[i]),
            int(self.output_tokens[i]),
            self.block_ids[i],
            int(self.session_ids[i]),
        )

    def __iter__(self) -> Iterator[Request]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        return f"Trace({self.name!r}, {len(self)} requests, {self.duration_s:.1f} s)"

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    @property
    def rate(self) -> float:
        """Mean requests per second over the trace's span."""
        return (len(self) - 1) / self.duration_s if self.duration_s > 0 else float("nan")

    def columns(self) -> tuple[list[float], list[int], list[int], list]:
        """The columns as plain Python lists (the simulators' hot loops index these), made once per
        trace and shared by its simulators: read them, do not change them."""
        if self._columns is None:
            self._columns = (self.arrival_s.tolist(), self.input_tokens.tolist(), self.output_tokens.tolist())
        return (*self._columns, self.block_ids)

    def take(self, indices: Sequence[int], arrival_s=None, name: str | None = None) -> "Trace":
        """The requests at ``indices`` (in that order), optionally with new arrival times."""
        idx = np.array(indices, dtype=np.int64)  # (a copy: kept in taken_from)
        idx.flags.writeable = False
        arrivals = self.arrival_s[idx] if arrival_s is None else _float_column("arrival_s", arrival_s)
        if len(arrivals) != len(idx):
            raise ValueError(f"arrival_s: expected {len(idx)} arrival times, got {len(arrivals)}")
        if len(arrivals) and np.any(np.diff(arrivals) < 0):
            raise ValueError("arrival_s: arrivals must be non-decreasing")
        # the columns are already validated: no per-block conversion (this backs i.i.d. resampling
        # at every reset of the admission environment)
        blocks = self.block_ids
        out = Trace.__new__(Trace)
        out._set(arrivals, self.input_tokens[idx], self.output_tokens[idx], [blocks[i] for i in idx.tolist()],
                 self.session_ids[idx], name or self.name, self.renamed_blocks, self.prefix_ids)
        out.taken_from = (self, idx)  # (the engine reads it from this trace's columns: native_trace)
        return out

    def head(self, n: int) -> "Trace":
        return self.take(range(min(n, len(self))))

    def scaled(self, speed: float) -> "Trace":
        """The same requests replayed ``speed`` times as fast (arrival times divided by ``speed``)."""
        check("speed", speed)
        name = self.name if speed == 1 else f"{self.name} x{speed:g}"
        return self.take(range(len(self)), arrival_s=self.arrival_s / speed, name=name)

    def stats(self) -> dict:
        """Requests, span, rate, length percentiles, distinct blocks and the ideal prefix-hit ratio."""
        inp, out = self.input_tokens, self.output_tokens
        pct = lambda a, q: float(np.percentile(a, q)) if len(a) else float("nan")  # noqa: E731
        hit_tokens, hit_blocks, total_blocks = ideal_prefix_hits(self)
        return {
            "name": self.name,
            "requests": len(self),
            "duration_s": self.duration_s,
            "rate_per_s": self.rate,
            "input_mean": float(inp.mean()) if len(self) else float("nan"),
            "input_p50": pct(inp, 50),
            "input_p90": pct(inp, 90),
            "input_p99": pct(inp, 99),
            "input_max": int(inp.max()) if len(self) else 0,
            "output_mean": float(out.mean()) if len(self) else float("nan"),
            "output_p50": pct(out, 50),
            "output_p90": pct(out, 90),
            "output_max": int(out.max()) if len(self) else 0,
            "sessions": int(len(np.unique(self.session_ids[self.session_ids >= 0]))),
            "distinct_blocks": len({b for ids in self.block_ids for b in ids}),
            "ideal_hit_ratio": hit_tokens / max(1, int(inp.sum())),
            "ideal_block_hit_ratio": hit_blocks / max(1, total_blocks),
            "renamed_blocks": self.renamed_blocks,
            "prefix_ids": self.prefix_ids,
        }


def _length(values) -> int:
    try:
        return len(values)
    except TypeError:
        raise ValueError(f"Trace: expected sequences as columns, got {type(values).__name__}") from None


def _float_column(name: str, values) -> np.ndarray:
    """``values`` as a float64 array of finite arrival times in the range of ``LIMITS['arrival_s']``."""
    try:
        a = np.array(values, dtype=np.float64)  # a copy: the caller's array stays writable
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}: expected a sequence of numbers (seconds)") from None
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a one-dimensional sequence, got shape {a.shape}")
    lim = LIMITS["arrival_s"]
    bad = np.flatnonzero(~((a >= lim.lo) & (a <= lim.hi)))  # NaN fails both comparisons
    if len(bad):
        raise ValueError(f"{name}: expected finite numbers in [{lim.lo}, {lim.hi:g}] {lim.unit}, got "
                         f"{a[bad[0]]!r} at request {bad[0]}")
    return a


def _int_column(name: str, values, kind: str) -> np.ndarray:
    """``values`` as an int64 array, each an integer in the range of ``LIMITS[kind]`` (floats,
    booleans, strings and integers beyond int64 are refused, not converted)."""
    lim = LIMITS[kind]
    try:
        a = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        a = None
    if a is None or a.ndim != 1 or (a.dtype.kind not in "iu" and len(a)):
        raise ValueError(f"{name}: expected a sequence of integers in [{lim.lo}, {lim.hi}] {lim.unit}")
    if len(a):
        bad = np.flatnonzero((a < lim.lo) | (a > lim.hi))
        if len(bad):
            raise ValueError(f"{name}: expected integers in [{lim.lo}, {lim.hi}] {lim.unit}, got "
                             f"{a[bad[0]]} at request {bad[0]}")
    return a.astype(np.int64)


def _block_column(block_ids) -> list[tuple[int, ...]]:
    """Each request's block ids as a tuple of ints in ``[0, MAX_ID]`` (refused otherwise)."""
    out = []
    for i, ids in enumerate(block_ids):
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"block_ids: request {i}: expected a sequence of integer ids, got {ids!r}")
        t = tuple(ids)
        if not all(type(b) is int for b in t):
            if not all(isinstance(b, (int, np.integer)) and not isinstance(b, (bool, np.bool_)) for b in t):
                raise ValueError(f"block_ids: request {i}: expected integer ids, got {list(t)!r}")
            t = tuple(map(int, t))
        if t and not (min(t) >= 0 and max(t) <= MAX_ID):
            raise ValueError(f"block_ids: request {i}: expected ids in [0, {MAX_ID}], got {list(t)!r}")
        out.append(t)
    return out


def prefix_block_ids(block_ids: list[tuple[int, ...]]) -> tuple[list[tuple[int, ...]], int]:
    """The block ids with prefix-hash semantics, and how many block occurrences were renamed.

    In Mooncake's traces an id names a block together with every block before it, so an id always
    follows the same predecessor (or always starts a prompt). The first time an id is seen fixes its
    predecessor; where it later follows another one, that occurrence is another block (as in the
    trace's prefix tree, the reading of ``kvcache-simulator`` and of ``cacheanalysis``) and gets a
    fresh id above every id of the trace, the same fresh id for the same (predecessor, id) pair.
    Traces that are already prefix-hashed come back unchanged (the same tuples). Every consumer
    (``replay``, ``trace stats``, ``cache``, the environments) reads the normalised ids.
    """
    missing = object()
    parent: dict[int, object] = {}
    fresh: dict[tuple, int] = {}
    next_id = None
    renamed = 0
    out = []
    for ids in block_ids:
        prev = None
        new = None
        for j, b in enumerate(ids):
            p = parent.get(b, missing)
            if p is missing:
                parent[b] = prev
            elif p != prev:
                key = (prev, b)
                nb = fresh.get(key)
                if nb is None:
                    if next_id is None:
                        next_id = 1 + max((max(t) for t in block_ids if t), default=-1)
                    if next_id > MAX_ID:
                        raise ValueError(f"block_ids: no id left above {MAX_ID} to rename a block that is not "
                                         f"a prefix hash")
                    nb = fresh[key] = next_id
                    parent[nb] = prev
                    next_id += 1
                if new is None:
                    new = list(ids)
                new[j] = b = nb
                renamed += 1
            prev = b
        out.append(ids if new is None else tuple(new))
    return out, renamed


def ideal_prefix_hits(trace: Trace, block_tokens: int = BLOCK_TOKENS) -> tuple[int, int, int]:
    """Hits of one infinite cache: (hit tokens, hit blocks, total blocks) over the whole trace."""
    seen: set[int] = set()
    hit_tokens = hit_blocks = total = 0
    for n_in, ids in zip(trace.input_tokens.tolist(), trace.block_ids):
        k = 0
        for b in ids:
            if b not in seen:
                break
            k += 1
        hit_blocks += k
        total += len(ids)
        hit_tokens += min(k * block_tokens, n_in)
        seen.update(ids)
    return hit_tokens, hit_blocks, total


# --------------------------------------------------------------------------------------------
# JSONL reading and writing
# --------------------------------------------------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_line(text: str, where: str, block_tokens: int):
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise TraceFormatError(f"{where}: not a trace line (JSON nested too deeply)") from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise TraceFormatError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for name in REQUIRED_FIELDS:
        if name not in obj:
            raise TraceFormatError(f"{where}: field '{name}' is missing")
    for name in ("timestamp", "input_length", "output_length"):
        _check_field(where, name, obj[name], name)
    session = obj.get("session_id", -1)
    _check_field(where, "session_id", session, "session_id")
    if "hash_ids" not in obj:
        return obj["timestamp"], obj["input_length"], obj["output_length"], None, session
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(_is_int(b) for b in ids):
        raise TraceFormatError(f"{where}: field 'hash_ids': expected a list of integers")
    expected = math.ceil(obj["input_length"] / block_tokens)
    if len(ids) != expected:
        raise TraceFormatError(
            f"{where}: field 'hash_ids': expected ceil(input_length/{block_tokens}) = {expected} ids, got {len(ids)}"
        )
    if ids and not (min(ids) >= 0 and max(ids) <= MAX_ID):
        bad = next(b for b in ids if not 0 <= b <= MAX_ID)
        raise TraceFormatError(f"{where}: field 'hash_ids': expected ids in [0, {MAX_ID}], got {_short(bad)}")
    dup = repeated_id(ids)
    if dup is not None:
        raise TraceFormatError(f"{where}: field 'hash_ids': id {dup} appears twice; prefix-hash ids of one "
                               f"request are distinct")
    return obj["timestamp"], obj["input_length"], obj["output_length"], ids, session


def _short(x) -> str:
    """``repr(x)`` cut to 40 characters (a field may hold a 4,000-digit integer)."""
    r = repr(x)
    return r if len(r) <= 40 else f"{r[:37]}..."


def _check_field(where: str, name: str, value, kind: str) -> None:
    """An integer field of a trace line in the range of ``LIMITS[kind]``, or a TraceFormatError."""
    lim = LIMITS[kind]
    if not _is_int(value):
        raise TraceFormatError(f"{where}: field '{name}': expected an integer, got {_short(value)}")
    if value < lim.lo:
        raise TraceFormatError(f"{where}: field '{name}': expected >= {lim.lo}, got {_short(value)}")
    if value > lim.hi:
        raise TraceFormatError(f"{where}: field '{name}': expected <= {lim.hi:,} {lim.unit}, got {_short(value)}")


def read_trace(path: str | os.PathLike, block_tokens: int = BLOCK_TOKENS, format: "str | TraceFormat" = "mooncake",
               prefix: str | None = None) -> Trace:
    """Read a trace file, validating every line (errors name file, line and field).

    ``format``: ``"mooncake"`` (Mooncake's JSONL, the default), ``"azure"``, ``"burstgpt"`` or
    ``"csv:timestamp=COL,input=COL,output=COL[,session=COL][,unit=s|ms|datetime]"``
    (:mod:`mooncake_gym.model.traceformats`). ``block_tokens`` is the tokens per prefix block.
    A source without prefix ids (the CSV formats, a JSONL without ``hash_ids``) gets ids by the rule
    ``prefix`` (:func:`derived_block_ids`; default ``"session"`` where the source names sessions,
    else ``"none"``); the trace's ``prefix_ids`` records which."""
    path = os.fspath(path)
    check("block_tokens", block_tokens)
    fmt = parse_format(format)
    if prefix is not None and prefix not in PREFIX_RULES:
        raise ValueError(f"prefix: expected one of {list(PREFIX_RULES)} or None, got {prefix!r}")
    name = os.path.splitext(os.path.basename(path))[0]
    if fmt.kind != "mooncake":
        cols = read_columns(path, fmt)
        return _with_derived_ids(cols.arrival_s, cols.input_tokens, cols.output_tokens, cols.session_ids, prefix,
                                 block_tokens, name, f"{path} ({fmt}) has no session column; use 'none' or name "
                                                     f"the column (csv:...,session=COL)")
    check_input_file(path, "trace")
    ts, inp, out, ids, sess = [], [], [], [], []
    last_ts = None
    with open(path, "rb") as f:  # bytes, so that a line that is not UTF-8 gets a TraceFormatError too
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceFormatError(f"{where}: not valid UTF-8 (byte {e.start + 1})") from None
            if not text.strip():
                continue
            try:
                t, i, o, h, s = _parse_line(text, where, block_tokens)
            except TraceFormatError as e:
                if lineno == 1 and "," in text and not text.lstrip().startswith("{"):  # a CSV header?
                    raise TraceFormatError(f"{e}; it looks like a CSV file: give its format (azure, burstgpt or "
                                           f"csv:timestamp=COL,input=COL,output=COL)") from None
                raise
            if ids and (h is None) != (ids[0] is None):
                raise TraceFormatError(f"{where}: field 'hash_ids': {'missing' if h is None else 'present'} "
                                       f"here but {'present' if h is None else 'missing'} on the first line; "
                                       f"give it on every line or on none")
            if last_ts is not None and t < last_ts:
                raise TraceFormatError(f"{where}: field 'timestamp': goes backwards ({t} < {last_ts})")
            last_ts = t
            ts.append(t)
            inp.append(i)
            out.append(o)
            ids.append(h)
            sess.append(s)
    if not ts:
        raise TraceFormatError(f"{path}: the trace has no requests")
    arrivals = np.asarray(ts, dtype=np.float64) / 1000.0
    if ids[0] is not None:
        if prefix is not None:
            raise ValueError(f"prefix: {path} has its own hash_ids; leave prefix out")
        return Trace(arrivals, inp, out, ids, sess, name=name)
    return _with_derived_ids(arrivals, inp, out, sess if any(x >= 0 for x in sess) else None, prefix, block_tokens,
                             name, f"{path} has no session_id fields; use 'none'")


def _with_derived_ids(arrivals, inputs, outputs, sessions, prefix: str | None, block_tokens: int, name: str,
                      no_sessions: str) -> Trace:
    """A trace from a source without prefix ids, its ids made by the rule ``prefix``
    (:func:`derived_block_ids`; None: ``"session"`` where ``sessions`` is given, else ``"none"``);
    ``no_sessions`` says why ``"session"`` cannot apply to a source without them."""
    rule = prefix or ("session" if sessions is not None else "none")
    if rule == "session" and sessions is None:
        raise ValueError(f"prefix: 'session' needs sessions: {no_sessions}")
    return Trace(arrivals, inputs, outputs, derived_block_ids(inputs, sessions, rule, block_tokens),
                 sessions, name=name, prefix_ids=rule)


def derived_block_ids(input_tokens: Sequence[int], session_ids: Sequence[int] | None, rule: str,
                      block_tokens: int = BLOCK_TOKENS) -> list[tuple[int, ...]]:
    """Prefix block ids for a trace whose source has none, by ``rule``:

    - ``"none"``: every request gets ``ceil(input / block_tokens)`` ids of its own: no request
      shares a prefix (what a trace without prefix information lets one assume, at worst);
    - ``"session"``: a request shares with the previous request of its session (a multi-turn
      conversation, whose next prompt begins with the previous one) that request's *full* blocks,
      ``min(floor(previous input / block_tokens), floor(input / block_tokens))`` leading ids (a
      partial last block hashes differently once more tokens follow), and gets new ids for the
      rest. A request without a session (id -1) shares nothing.
    """
    if rule not in PREFIX_RULES:
        raise ValueError(f"prefix: expected one of {list(PREFIX_RULES)}, got {rule!r}")
    out: list[tuple[int, ...]] = []
    last: dict[int, tuple[tuple[int, ...], int]] = {}  # session -> (its last request's ids, full blocks)
    fresh = 0
    for k, n in enumerate(input_tokens):
        blocks = math.ceil(n / block_tokens)
        s = -1 if session_ids is None or rule == "none" else int(session_ids[k])
        shared: tuple[int, ...] = ()
        if s >= 0 and s in last:
            prev, full = last[s]
            shared = prev[:min(full, n // block_tokens)]
        ids = shared + tuple(range(fresh, fresh + blocks - len(shared)))
        fresh += blocks - len(shared)
        out.append(ids)
        if s >= 0:
            last[s] = (ids, n // block_tokens)
    return out


def trace_lines(trace: Trace) -> Iterator[str]:
    """The JSONL lines of a trace (Mooncake's field order and separators)."""
    ts = np.rint(trace.arrival_s * 1000.0).astype(np.int64).tolist()
    for t, i, o, h, s in zip(
        ts, trace.input_tokens.tolist(), trace.output_tokens.tolist(), trace.block_ids, trace.session_ids.tolist()
    ):
        obj = {"timestamp": t, "input_length": i, "output_length": o, "hash_ids": list(h)}
        if s >= 0:
            obj["session_id"] = s
        yield json.dumps(obj)


def write_trace(trace: Trace, path: str | os.PathLike, block_tokens: int = BLOCK_TOKENS) -> None:
    """Write a trace as JSONL; reading it back and writing again gives the same bytes.

    Every line is checked with the reader's own check before the file is opened, so no line the
    reader would refuse is written (``ValueError`` naming the request); an empty trace is refused
    too (the reader refuses a file without requests). The file is written whole or not at all."""
    if not isinstance(trace, Trace):
        raise ValueError(f"trace: expected a mooncake_gym.model.workload.Trace, got {type(trace).__name__}")
    lines = list(trace_lines(trace))
    if not lines:
        raise ValueError("trace: it has no requests, and the reader refuses a trace file without requests")
    for k, line in enumerate(lines):
        _parse_line(line, f"trace {trace.name!r}, request {k}", block_tokens)
    write_atomic(path, "".join(line + "\n" for line in lines))


# --------------------------------------------------------------------------------------------
# Synthetic generator
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyntheticConfig:
    """Distributions of the synthetic workload (all lengths in tokens, times in seconds).

    Sessions arrive as a Poisson process at ``rate`` per second. Each opens with one of
    ``n_system_prompts`` system prompts (popularity Zipf with exponent ``system_prompt_zipf``, length
    a whole number of blocks drawn uniformly from ``system_prompt_blocks``), shared by many sessions.
    A session is a *document* session with probability ``document_share`` (a long document read
    once, then ``1 + Geometric`` questions about it, each prompt = system + document + question) or
    else a *chat* (each turn's prompt = the whole conversation so far + a new user message, so it
    extends the previous prompt). Follow-up requests come after exponential think times. Lengths
    are log-normal (long-tailed) with the given means and log-space sigmas.

    With the defaults a session issues about 2.1 requests; prompts average about 7,500 tokens
    (median about 5,500, p99 about 34,000) and outputs about 180 tokens (median about 110), close to
    Mooncake's arXiv trace (means 7,590 and 182). Calibrated so that lecture demo 2's conclusions
    hold on 8 instances x 3,000 blocks: random routing hits about 27-29 % of input tokens and
    cache-aware routing about 1.9x that; at ``rate=8`` (about 17 requests/s) random routing
    overloads the cluster while cache-aware keeps up.
    """

    document_share: float = 0.5
    n_system_prompts: int = 16
    system_prompt_zipf: float = 1.0
    system_prompt_blocks: tuple[int, int] = (1, 4)
    document_mean: float = 7500.0
    document_sigma: float = 0.9
    questions_mean: float = 2.2
    question_mean: float = 150.0
    question_sigma: float = 0.8
    chat_first_mean: float = 3500.0
    chat_first_sigma: float = 1.0
    turns_mean: float = 2.2
    chat_turn_mean: float = 600.0
    chat_turn_sigma: float = 1.0
    output_mean: float = 180.0
    output_sigma: float = 1.0
    output_max: int = 4096
    input_max: int = 200_000
    think_time_mean_s: float = 15.0

    def __post_init__(self):
        for name in ("document_share",):
            check_range(name, getattr(self, name), 0.0, 1.0)
        for name in ("n_system_prompts",):
            check_range(name, getattr(self, name), 1, 10**6, integer=True)
        lo_hi = self.system_prompt_blocks
        if not (isinstance(lo_hi, tuple) and len(lo_hi) == 2):
            raise ValueError(f"system_prompt_blocks: expected (low, high), got {lo_hi!r}")
        check_range("system_prompt_blocks", lo_hi[0], 1, 10**4, integer=True)
        check_range("system_prompt_blocks", lo_hi[1], lo_hi[0], 10**4, integer=True)
        for name in ("system_prompt_zipf", "document_sigma", "question_sigma", "chat_first_sigma", "chat_turn_sigma",
                     "output_sigma"):
            check_range(name, getattr(self, name), 0.0, 10.0)
        for name in ("document_mean", "question_mean", "chat_first_mean", "chat_turn_mean", "output_mean"):
            check_range(name, getattr(self, name), 1e-3, MAX_INPUT_TOKENS)
        for name in ("questions_mean", "turns_mean"):
            check_range(name, getattr(self, name), 1.0, 1e4)
        check("output_length", self.output_max, "output_max")
        check_range("input_max", self.input_max, 1, MAX_INPUT_TOKENS, integer=True)
        check_range("think_time_mean_s", self.think_time_mean_s, 0.0, 1e6)


DEFAULT_SYNTHETIC = SyntheticConfig()

#: The synthetic generator with longer prompts, its parameters chosen from the published statistics of
#: Mooncake's public synthetic trace (FAST'25 release; ../shared/traces/README.md: prompts of 15,326
#: tokens on average, median 11,587, p90 38,611, p99 66,456; outputs 149 on average, median 69), never
#: from its requests: every prompt-length mean 2.3 times the default's, the documents' and first chat
#: messages' log-space sigmas 0.7 (narrower tails than the default's 0.9 and 1.0), outputs of mean 149
#: with sigma 1.24 (a log-normal of median 69). Seed 0 at 4 sessions/s for 600 s: 4,928 requests,
#: prompts 15,359 tokens on average, median 12,273, p90 27,912, p99 62,490; 56 % of the prompt tokens
#: are a prefix of an earlier request's (the trace's 65 %).
LONG_PROMPT_SYNTHETIC = SyntheticConfig(document_mean=17_250.0, document_sigma=0.7, question_mean=345.0,
                                        chat_first_mean=8_050.0, chat_first_sigma=0.7, chat_turn_mean=1_380.0,
                                        output_mean=149.0, output_sigma=1.24)


@dataclass(frozen=True)
class BurstyArrivals:
    """Bursty session arrivals: a two-state Markov-modulated Poisson process (MMPP-2).

    The session arrival rate alternates between a *calm* and a *burst* state; each state lasts an
    exponential time with mean ``calm_s`` or ``burst_s`` seconds, and in the burst state sessions
    arrive ``burst_ratio`` times as fast as in the calm state. The two rates are scaled so that
    the long-run mean stays the generator's ``rate``: with ``p = burst_s / (calm_s + burst_s)``
    the share of time in bursts, the calm rate is ``rate / (1 - p + p * burst_ratio)`` and the
    burst rate ``burst_ratio`` times that. The first state is drawn from the stationary
    distribution (burst with probability ``p``). ``burst_ratio=1`` is a Poisson process again
    (with other arrival times than the default generator's).

    MMPPs are the standard model of bursty request traffic (Fischer and Meier-Hellstern, "The
    Markov-modulated Poisson process (MMPP) cookbook", Performance Evaluation 18(2), 1993).
    Follow-up requests of a session still come after the session's think times.
    """

    burst_ratio: float = 4.0
    calm_s: float = 20.0
    burst_s: float = 10.0

    def __post_init__(self):
        check_range("burst_ratio", self.burst_ratio, 1.0, 1e3)
        check_range("calm_s", self.calm_s, 1e-3, 1e6)
        check_range("burst_s", self.burst_s, 1e-3, 1e6)

    @property
    def burst_share(self) -> float:
        """Long-run share of time spent in the burst state."""
        return self.burst_s / (self.calm_s + self.burst_s)

    def multipliers(self) -> tuple[float, float]:
        """(calm, burst) rate as multiples of the mean rate."""
        p = self.burst_share
        calm = 1.0 / (1.0 - p + p * self.burst_ratio)
        return calm, calm * self.burst_ratio

    def clock(self, rng: np.random.Generator) -> "_ModulatedClock":
        """The time change of one trace (:class:`_ModulatedClock`), its path drawn from ``rng``."""
        return _ModulatedClock(self, rng)

    def describe(self) -> str:
        return f"bursty {self.burst_ratio:g}x {self.burst_s:g}s/{self.calm_s:g}s"


@dataclass(frozen=True)
class DiurnalArrivals:
    """Diurnal arrivals: a non-homogeneous Poisson process whose rate follows a sinusoid.

    The arrival rate at time ``t`` (seconds from the trace's start) is the generator's mean rate
    times ``1 - amplitude * cos(2 pi t / period_s)``: a daily cycle compressed to ``period_s``
    seconds, starting at its trough (``1 - amplitude`` times the mean), peaking at ``period_s / 2``
    (``1 + amplitude`` times the mean), with the mean rate over every whole period. ``amplitude``
    is in [0, 0.99] (0: a Poisson process at the mean rate, with the default generator's arrivals);
    ``period_s`` in [0.001, 1e7] s.

    It is made by a time change, as :class:`BurstyArrivals` is: the homogeneous arrivals at the mean
    rate, at "operational times" ``s``, happen at the real times ``t`` where the cumulative rate
    multiplier ``t - amplitude * period_s / (2 pi) * sin(2 pi t / period_s)`` reaches ``s`` (the
    inverse of a continuous strictly increasing function, found by bisection). A unit-rate Poisson
    process mapped through the inverse of a cumulative intensity is the non-homogeneous Poisson
    process of that intensity (Cinlar, "Introduction to Stochastic Processes", 1975),
    the same law that thinning (Lewis and Shedler, Naval Research Logistics Quarterly 26(3),
    1979) samples; the time change needs no random numbers of its own, so every other draw, and
    the requests themselves, are the default generator's.
    """

    amplitude: float = 0.5
    period_s: float = 600.0

    def __post_init__(self):
        check_range("amplitude", self.amplitude, 0.0, 0.99)
        check_range("period_s", self.period_s, 1e-3, 1e7)

    def multiplier(self, t):
        """The rate at real time ``t`` (s) as a multiple of the mean rate."""
        return 1.0 - self.amplitude * np.cos(2.0 * math.pi * np.asarray(t, dtype=np.float64) / self.period_s)

    def operational_time(self, t):
        """The integral of :meth:`multiplier` from 0 to ``t``: the expected arrivals by ``t`` over the mean rate."""
        t = np.asarray(t, dtype=np.float64)
        w = 2.0 * math.pi / self.period_s
        return t - self.amplitude / w * np.sin(w * t)

    def clock(self, rng: np.random.Generator | None = None) -> "DiurnalArrivals":
        """The time change (it is deterministic: ``rng`` is not used)."""
        return self

    def real_time(self, s: np.ndarray) -> np.ndarray:
        """The real times at which the cumulative multiplier reaches the operational times ``s``
        (non-decreasing in, non-decreasing out)."""
        s = np.asarray(s, dtype=np.float64)
        reach = self.amplitude * self.period_s / (2.0 * math.pi)  # |operational_time(t) - t| <= reach
        lo, hi = np.maximum(s - reach, 0.0), s + reach
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            below = self.operational_time(mid) < s
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return np.maximum.accumulate(hi) if len(hi) else hi  # (monotone up to the rounding of sin)

    def describe(self) -> str:
        return f"diurnal {self.amplitude:g} x {self.period_s:g}s"


#: Bisection steps of :meth:`DiurnalArrivals.real_time`: the bracket (at most ``period_s / pi`` wide)
#: halved 64 times is below a float's resolution of the times it brackets.
_BISECTIONS = 64

#: The arrival processes besides Poisson (:func:`as_arrivals` makes one from a dict of its fields).
ARRIVAL_PROCESSES = (BurstyArrivals, DiurnalArrivals)


def as_arrivals(value) -> BurstyArrivals | DiurnalArrivals | None:
    """None (Poisson arrivals), a :class:`BurstyArrivals` or :class:`DiurnalArrivals`, or a dict of
    the fields of one of them (``amplitude``/``period_s``: diurnal; otherwise bursty);
    ``ValueError`` naming ``arrivals`` otherwise."""
    if value is None or isinstance(value, ARRIVAL_PROCESSES):
        return value
    if isinstance(value, dict):
        diurnal = {f.name for f in fields(DiurnalArrivals)}
        cls = DiurnalArrivals if value and set(value) <= diurnal else BurstyArrivals
        try:
            return cls(**value)
        except TypeError as e:
            raise ValueError(f"arrivals: expected fields of BurstyArrivals (burst_ratio, calm_s, burst_s) or of "
                             f"DiurnalArrivals (amplitude, period_s): {e}") from None
    raise ValueError(f"arrivals: expected None, a dict of BurstyArrivals or DiurnalArrivals fields, or one of them, "
                     f"got {type(value).__name__}")


class _ModulatedClock:
    """The time change that turns a Poisson process at the mean rate into the MMPP: a homogeneous
    arrival at "operational time" ``s`` happens at the real time ``t`` where the integral of the
    rate multiplier from 0 to ``t`` reaches ``s`` (a Cox process; the multiplier's path is drawn
    from ``rng``, independently of everything else)."""

    def __init__(self, arrivals: BurstyArrivals, rng: np.random.Generator):
        self.rng = rng
        self.mean_s = (arrivals.calm_s, arrivals.burst_s)
        self.rate = arrivals.multipliers()
        self.state = int(rng.random() < arrivals.burst_share)
        self.t, self.s, self.slope = [0.0], [0.0], []  # segment starts (real and operational), slopes

    def real_time(self, s: np.ndarray) -> np.ndarray:
        while self.s[-1] <= s[-1]:  # draw state sojourns until the last operational time is covered
            d = float(self.rng.exponential(self.mean_s[self.state]))
            m = self.rate[self.state]
            self.slope.append(m)
            self.t.append(self.t[-1] + d)
            self.s.append(self.s[-1] + d * m)
            self.state = 1 - self.state
        starts = np.asarray(self.s[:-1])
        i = np.searchsorted(starts, s, side="right") - 1
        return np.asarray(self.t[:-1])[i] + (s - starts[i]) / np.asarray(self.slope)[i]


#: Sessions drawn per batch. The generator draws its random numbers batch by batch, in a fixed
#: order, so a trace cut to n requests is the head of the same seed's longer traces.
SESSION_BATCH = 256


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """Log-normal draws with the given arithmetic mean and log-space sigma."""
    return rng.lognormal(math.log(mean) - sigma * sigma / 2.0, sigma, size)


def _lengths(x: np.ndarray) -> np.ndarray:
    """Token counts from continuous draws: rounded (half to even), at least 1."""
    return np.maximum(1, np.rint(x)).astype(np.int64)


def _session_draws(rng: np.random.Generator, rate: float, c: SyntheticConfig, assembly=None) -> dict:
    """The draws of ``SESSION_BATCH`` sessions and their requests, in the generator's fixed order.

    Sessions: start gaps, system prompt and kind (uniforms), document and first-message lengths
    (both drawn, one used), question and turn counts (both drawn, one used). Requests (session by
    session): output, question and chat-turn lengths, think time before. ``assembly``: the
    engine's (counts the requests natively), or None.
    """
    s = SESSION_BATCH
    d = {"gaps": rng.exponential(1.0 / rate, s), "prompt_u": rng.random(s), "doc_u": rng.random(s),
         "doc_len": _lognormal(rng, c.document_mean, c.document_sigma, s),
         "chat_len": _lognormal(rng, c.chat_first_mean, c.chat_first_sigma, s),
         "questions": rng.geometric(1.0 / c.questions_mean, s), "turns": rng.geometric(1.0 / c.turns_mean, s)}
    if assembly is None:
        r = int(np.where(d["doc_u"] < c.document_share, d["questions"], d["turns"]).sum())
    else:
        r = assembly.requests(d["doc_u"], d["questions"], d["turns"], c.document_share)
    d["out"] = _lognormal(rng, c.output_mean, c.output_sigma, r)
    d["question"] = _lognormal(rng, c.question_mean, c.question_sigma, r)
    d["turn"] = _lognormal(rng, c.chat_turn_mean, c.chat_turn_sigma, r)
    d["think"] = rng.exponential(c.think_time_mean_s, r)
    return d


def _session_batch(d: dict, start: np.ndarray, c: SyntheticConfig, cdf: np.ndarray) -> dict:
    """One batch's draws ``d`` (:func:`_session_draws`) and its sessions' starts as numpy columns
    (the numpy reference of the engine's ``SyntheticAssembly.add``)."""
    is_doc = d["doc_u"] < c.document_share
    b = {"start": start, "prompt": np.searchsorted(cdf, d["prompt_u"], side="right"),  # Generator.choice(p=...)'s rule
         "is_doc": is_doc,
         "opening": np.where(is_doc, _lengths(d["doc_len"]), _lengths(d["chat_len"])),
         "n": np.where(is_doc, d["questions"], d["turns"]),
         "out": np.minimum(c.output_max, _lengths(d["out"])), "question": _lengths(d["question"]),
         "turn": _lengths(d["turn"])}
    first = np.zeros(len(b["out"]), bool)
    first[np.cumsum(b["n"]) - b["n"]] = True
    b["first"] = first
    b["arrival"] = np.repeat(start, b["n"]) + _segment_cumsum(np.where(first, 0.0, d["think"]), first)
    return b


def _segment_cumsum(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``x`` restarting at every index where ``first`` is set (``first[0]`` set)."""
    total = np.cumsum(x)
    starts = np.flatnonzero(first)
    before = (total[starts] - x[starts])[np.cumsum(first) - 1]
    return total - before


def synthetic_trace(
    seed: int | np.random.Generator = 0,
    rate: float = 4.0,
    duration_s: float | None = 600.0,
    n_requests: int | None = None,
    config: SyntheticConfig = DEFAULT_SYNTHETIC,
    block_tokens: int = BLOCK_TOKENS,
    arrivals: BurstyArrivals | DiurnalArrivals | dict | None = None,
) -> Trace:
    """A synthetic trace imitating Mooncake's public traces (see :class:`SyntheticConfig`).

    ``rate`` is the session arrival rate per second; sessions start in ``[0, duration_s)`` and
    requests after ``duration_s`` are dropped. With ``n_requests`` the trace is cut to its first
    ``n_requests`` requests; with ``duration_s=None`` sessions are generated just until those are
    complete (with both, the trace may hold fewer than ``n_requests`` if the duration ends first).
    Deterministic per seed, and a shorter trace is the head of a longer one of the same seed and
    rate. Block ids are numbered in order of first appearance, as in Mooncake's traces.

    ``arrivals``: None (default) for Poisson session arrivals, :class:`BurstyArrivals` for a
    two-state Markov-modulated Poisson process, or :class:`DiurnalArrivals` for a sinusoidal rate,
    each with the same mean ``rate`` (or a dict of one's fields, :func:`as_arrivals`): the same
    sessions, their starts moved by a time change (the bursty one's path drawn from a generator
    spawned from the seed's, so every other draw is the default's).
    """
    check("rate", rate)
    check("requests", n_requests, "n_requests", allow_none=True)
    if duration_s is None and n_requests is None:
        raise ValueError("duration_s: give a duration, n_requests, or both")
    check("duration_s", duration_s, allow_none=True)
    if not isinstance(config, SyntheticConfig):
        raise ValueError(f"config: expected a SyntheticConfig, got {type(config).__name__}")
    if n_requests is None:  # sessions start until duration_s: bound their number before drawing them
        check_bound("rate", rate * duration_s, MAX_SYNTHETIC_SESSIONS, "sessions (rate x duration_s)",
                    "lower the rate or the duration, or give n_requests")
    process = as_arrivals(arrivals)  # (the name ``arrivals`` is reused below for the arrival columns)
    horizon = math.inf if duration_s is None else duration_s
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    clock = None if process is None else process.clock(rng.spawn(1)[0])
    operational = 0.0  # bursty or diurnal arrivals: the homogeneous process's last session start
    c = config
    lo, hi = c.system_prompt_blocks
    prompt_blocks = rng.integers(lo, hi + 1, size=c.n_system_prompts)
    cdf = _prompt_cdf(c.n_system_prompts, c.system_prompt_zipf)
    assembly = _assembly(c, cdf, prompt_blocks, block_tokens)

    # Draw session batches until the trace is complete: every later session starts after the
    # last one drawn, so the requests that arrived before that start are final.
    batches, start = [], 0.0
    while True:
        d = _session_draws(rng, rate, c, assembly)
        if clock is None:
            starts = start + np.cumsum(d["gaps"])
        else:
            homogeneous = operational + np.cumsum(d["gaps"])
            operational = float(homogeneous[-1])
            starts = clock.real_time(homogeneous)
        start = float(starts[-1])
        if assembly is not None:
            assembly.add(starts, d["prompt_u"], d["doc_u"], d["doc_len"], d["chat_len"], d["questions"], d["turns"],
                         d["out"], d["question"], d["turn"], d["think"])
        else:
            batches.append(_session_batch(d, starts, c, cdf))
        if start >= horizon:
            break
        if n_requests is not None and (assembly.arrivals_before(start) if assembly is not None else
                                       sum(int((b["arrival"] < start).sum()) for b in batches)) >= n_requests:
            break
    if assembly is not None:
        arrival, total, out, session, *flat = assembly.build(horizon, -1 if n_requests is None else n_requests)
        flat = tuple(flat)
    else:
        arrival, total, out, session, flat = _assemble_reference(batches, horizon, n_requests, c, prompt_blocks,
                                                                 block_tokens)
    if len(arrival) and not arrival[-1] <= LIMITS["arrival_s"].hi:
        raise ValueError(f"rate: at {rate:g} sessions/s the trace would span {arrival[-1]:.3g} s, more than "
                         f"the limit of {LIMITS['arrival_s'].hi:g} s; raise the rate or ask for fewer requests")
    out_trace = Trace.__new__(Trace)  # the columns are built valid: no re-conversion
    out_trace._set(arrival, total, out, None, session,
                   f"synthetic(rate={rate:g}, seed={seed if isinstance(seed, (int, np.integer)) else 'rng'}"
                   + ("" if process is None else f", {process.describe()}") + ")", flat=flat)
    return out_trace


@functools.lru_cache(maxsize=16)
def _prompt_cdf(n_prompts: int, zipf: float) -> np.ndarray:
    """The system prompts' popularity CDF (Zipf with exponent ``zipf``; read-only)."""
    pop = 1.0 / np.arange(1, n_prompts + 1) ** zipf
    cdf = np.cumsum(pop / pop.sum())
    cdf /= cdf[-1]
    cdf.flags.writeable = False
    return cdf


def _assembly(c: SyntheticConfig, cdf: np.ndarray, prompt_blocks: np.ndarray, block_tokens: int):
    """The engine's ``SyntheticAssembly`` of one trace (``_engine/synthetic.hpp``), or None where the
    engine is not built (then :func:`_session_batch` and :func:`_assemble_reference` assemble it)."""
    if _engine.native is None:
        return None
    return _engine.native.SyntheticAssembly(float(c.document_share), int(c.output_max), int(c.input_max),
                                            int(block_tokens), cdf.tolist(), prompt_blocks.tolist())


def _assemble_reference(batches: list, horizon: float, n_requests: int | None, c: SyntheticConfig,
                        prompt_blocks: np.ndarray, block_tokens: int) -> tuple:
    """The trace's columns from its session batches (:func:`_session_batch`), in numpy: arrival,
    input and output tokens, session and the flat block ids (the reference of the engine's
    ``SyntheticAssembly.build``)."""
    b = {k: np.concatenate([x[k] for x in batches]) for k in batches[0]}
    n_sessions = len(b["start"])
    session = np.repeat(np.arange(n_sessions), b["n"])
    is_doc = b["is_doc"][session]
    first = b["first"]
    # The session's shared token stream: system prompt, then the document (document sessions) or the
    # conversation so far (chats: first message, then each earlier output and the new message).
    prev_out = np.concatenate([[0], b["out"][:-1]])
    grow = np.where(first, b["opening"][session], np.where(is_doc, 0, prev_out + b["turn"]))
    prompt = b["prompt"][session]
    shared = prompt_blocks[prompt] * block_tokens + _segment_cumsum(grow, first)
    total = np.minimum(shared + np.where(is_doc, b["question"], 0), c.input_max)
    order = np.flatnonzero(b["arrival"] < horizon)
    order = order[np.lexsort((session[order], b["arrival"][order]))]
    if n_requests is not None:
        order = order[:n_requests]
    arrival, session, total, out = b["arrival"][order], session[order], total[order], b["out"][order]
    prompt, shared = prompt[order], shared[order]
    flat = _block_ids_reference(total, np.minimum(shared, total) // block_tokens, prompt_blocks, prompt, session,
                                block_tokens, c.input_max)
    return arrival, total, out, session, flat


def _block_ids_reference(total, full_shared, prompt_blocks, prompt, session, block_tokens, input_max
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Each request's block ids, numbered in order of first appearance, as a flat column
    ``(starts, ids)`` (:attr:`Trace.flat_blocks`), in numpy.

    Block j of a request is, for ``j < full_shared``, block j of its session's shared stream: the
    system prompt's own block while ``j`` is inside the prompt (shared by every session with that
    prompt), else the session's block j. The rest (the question, the partial last block) are the
    request's own. Raw ids are made unique per role and then renumbered. The native engine makes
    the same ids (integer arithmetic only: ``_engine/synthetic.hpp`` ``synthetic_block_ids``, run by
    ``SyntheticAssembly.build``); this is the reference.
    """
    n_blocks = -(-total // block_tokens)
    ends = np.cumsum(n_blocks)
    starts = ends - n_blocks
    req = np.repeat(np.arange(len(total)), n_blocks)
    pos = np.arange(int(ends[-1]) if len(ends) else 0) - starts[req]
    width = -(-input_max // block_tokens) + 1
    prompt_offset = np.concatenate([[0], np.cumsum(prompt_blocks)])
    n_prompt_ids = int(prompt_offset[-1])
    shared = pos < full_shared[req]
    raw = np.where(pos < np.minimum(prompt_blocks[prompt], full_shared)[req],
                   prompt_offset[prompt][req] + pos,
                   np.where(shared, n_prompt_ids + session[req] * width + pos,
                            n_prompt_ids + (int(session.max(initial=0)) + 1) * width + req * width + pos))
    _, first_index, inverse = np.unique(raw, return_index=True, return_inverse=True)
    rank = np.empty(len(first_index), np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(len(first_index))
    return np.concatenate(([0], ends)).astype(np.int64), rank[inverse].reshape(-1).astype(np.int64)


def resample_iid(trace: Trace, n_requests: int, rate: float, seed: int | np.random.Generator = 0,
                 fresh_blocks: bool = False, arrivals: BurstyArrivals | DiurnalArrivals | dict | None = None) -> Trace:
    """``n_requests`` requests drawn i.i.d. (with replacement) from ``trace`` with stationary
    Poisson arrivals at ``rate`` per second (lecture demo 3), or with ``arrivals``
    (:func:`as_arrivals`: bursty or diurnal, the same mean ``rate``): the same requests, their
    arrivals moved by the process's time change (the bursty one's path drawn from a generator
    spawned from ``seed``'s, so the draws and every later one are the default's).

    A request drawn twice repeats its prompt's blocks exactly, so a long draw from a short base
    trace hits the prefix caches more and more often. ``fresh_blocks=True`` (opt-in; the draws and
    arrivals are the same either way) gives every re-drawn copy of a request fresh ids for the
    blocks it brought into ``trace`` (no earlier request holds them; :func:`redrawn_block_ids`), so
    that a copy reuses what its request reused in the trace and no more."""
    check("requests", n_requests, "n_requests")
    check("rate", rate)
    if not isinstance(fresh_blocks, (bool, np.bool_)):
        raise ValueError(f"fresh_blocks: expected True or False, got {fresh_blocks!r}")
    if len(trace) == 0:
        raise ValueError("trace: expected a base trace with at least one request")
    process = as_arrivals(arrivals)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    idx = rng.integers(0, len(trace), size=n_requests)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n_requests))
    if process is not None:
        times = process.clock(rng.spawn(1)[0]).real_time(times)
    shape = "" if process is None else f", {process.describe()}"
    out = trace.take(idx, arrival_s=times, name=f"{trace.name} iid({n_requests} @ {rate:.3g}/s{shape}"
                                                f"{', fresh blocks' if fresh_blocks else ''})")
    if fresh_blocks:
        out.block_ids = redrawn_block_ids(trace, idx.tolist())
    return out


def redrawn_block_ids(trace: Trace, indices: Sequence[int]) -> list[tuple[int, ...]]:
    """The block ids of ``trace``'s requests at ``indices`` (a draw with replacement), each request
    drawn again getting fresh ids for the blocks it brought into the trace.

    In ``trace``, request i *reuses* a block that an earlier request (a smaller index) holds, a
    system prompt or its session's earlier turns, and *brings* the others. The first copy of a
    request keeps its ids; each later copy keeps the blocks it reuses and numbers the blocks it
    brings anew, from one above ``trace``'s largest id, in the order of ``indices``. An id names a
    block with every block before it, so the reused blocks come first and the new ids are prefix
    hashes again. A copy can then hit the caches for what its request hit in the trace and never
    for what only that request had: over a long draw an infinite cache's hit ratio tends to the
    trace's own (``Trace.stats()['ideal_hit_ratio']``). (Renaming only the blocks no other request
    holds does not: a session's earlier turn, whose blocks its later turns hold, would hit its own
    whole prompt at every re-draw.) The first request to bring a shared block, such as a system
    prompt, brings it again at each re-draw."""
    first: dict[int, int] = {}
    for i, ids in enumerate(trace.block_ids):
        for b in ids:
            first.setdefault(b, i)
    next_id = 1 + max(first, default=-1)
    drawn: set[int] = set()
    out = []
    for i in indices:
        ids = trace.block_ids[i]
        if i not in drawn:
            drawn.add(i)
            out.append(ids)
            continue
        new = []
        for b in ids:
            if first[b] < i:
                new.append(b)
            else:
                new.append(next_id)
                next_id += 1
        if next_id - 1 > MAX_ID:
            raise ValueError(f"fresh_blocks: no id left above {MAX_ID} for the re-drawn requests' own blocks")
        out.append(tuple(new))
    return out


def load_workload(trace: str | os.PathLike | Trace = "synthetic", rate: float = 4.0, seed: int = 0,
                  speed: float = 1.0, trace_format: "str | TraceFormat" = "mooncake", **synthetic_kw) -> Trace:
    """A trace object from a path (in ``trace_format``: :func:`read_trace`), the word ``synthetic``
    (generator at ``rate``, ``seed``) or a Trace."""
    check("speed", speed)
    if isinstance(trace, Trace):
        t = trace
    elif str(trace) == "synthetic":
        t = synthetic_trace(seed, rate, **synthetic_kw)
    else:
        t = read_trace(trace, format=trace_format)
    return t if speed == 1 else t.scaled(speed)


def config_dict(config: SyntheticConfig = DEFAULT_SYNTHETIC) -> dict:
    return asdict(config)
