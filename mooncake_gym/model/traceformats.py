"""Request traces in other public formats than Mooncake's JSONL: the columns they hold.

Three sources publish per-request LLM inference traces as CSV with one row per request:

- ``azure``: Azure's LLM inference traces (AzurePublicDataset, 2023 "Splitwise" code and
  conversation traces, 2024 "DynamoLLM" week-long traces): ``TIMESTAMP,ContextTokens,GeneratedTokens``,
  ``TIMESTAMP`` a wall-clock time such as ``2023-11-16 18:15:46.6805900`` (100 ns ticks);
- ``burstgpt``: BurstGPT (Wang et al., arXiv 2401.17644, Azure OpenAI GPT service logs):
  ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``, ``Timestamp`` in seconds
  from the trace's start; its later releases add ``Session ID`` (and ``Elapsed time``);
- ``csv``: any CSV with a header, its columns named by the user:
  ``csv:timestamp=COL,input=COL,output=COL[,session=COL][,unit=s|ms]``.

None of them holds prefix block ids (Mooncake's ``hash_ids``): :func:`read_columns` returns the
arrival times (seconds from the first request), prompt and output lengths and, where the source
has one, the session of each request; :func:`mooncake_gym.model.workload.read_trace` then makes the
ids by a stated rule (``prefix``: ``none`` or ``session``; see ``workload.derived_block_ids``).

Every row is checked: the header must hold the format's columns; a timestamp must parse and never
go backwards; token counts are integers in the ranges of :mod:`mooncake_gym.model.limits`. An error
is a :class:`TraceFormatError` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from mooncake_gym._files import check_input_file
from mooncake_gym.model.limits import LIMITS, MAX_GENERATED_REQUESTS


class TraceFormatError(ValueError):
    """A trace file line that does not follow the format; the message names file, line and field."""


#: The formats a trace file can be read in: Mooncake's JSONL (the default) and the CSV sources.
TRACE_FORMATS = ("mooncake", "azure", "burstgpt", "csv")
#: Units of a ``csv`` timestamp column: seconds or milliseconds as numbers, or wall-clock times.
TIMESTAMP_UNITS = ("s", "ms", "datetime")
#: How prefix block ids are made for a trace whose source has none.
PREFIX_RULES = ("none", "session")


@dataclass(frozen=True)
class TraceFormat:
    """A trace file's format: ``kind`` (one of :data:`TRACE_FORMATS`) and, for the CSV sources, the
    header names of the timestamp, input, output and (optional) session columns and the timestamp's
    unit."""

    kind: str = "mooncake"
    timestamp: str = ""
    input: str = ""
    output: str = ""
    session: str | None = None
    unit: str = "s"

    def __str__(self) -> str:
        if self.kind != "csv":
            return self.kind
        cols = [f"timestamp={self.timestamp}", f"input={self.input}", f"output={self.output}"]
        if self.session is not None:
            cols.append(f"session={self.session}")
        return "csv:" + ",".join([*cols, f"unit={self.unit}"])


AZURE = TraceFormat("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", None, "datetime")
#: BurstGPT's session column, where a release has one (read when the header holds it)
BURSTGPT_SESSION = "Session ID"
BURSTGPT = TraceFormat("burstgpt", "Timestamp", "Request tokens", "Response tokens", None, "s")
MOONCAKE = TraceFormat()


def parse_format(text: "str | TraceFormat", columns: str | None = None) -> TraceFormat:
    """A :class:`TraceFormat` from ``mooncake``, ``azure``, ``burstgpt`` or
    ``csv:timestamp=COL,input=COL,output=COL[,session=COL][,unit=s|ms|datetime]`` (or ``csv`` with
    the column list in ``columns``, ``trace convert --columns``'s form)."""
    if isinstance(text, TraceFormat):
        return text
    if not isinstance(text, str):
        raise ValueError(f"trace format: expected one of {list(TRACE_FORMATS)}, got {text!r}")
    kind, _, spec = text.partition(":")
    if kind not in TRACE_FORMATS:
        raise ValueError(f"trace format: expected one of {list(TRACE_FORMATS)} "
                         f"(csv as csv:timestamp=COL,input=COL,output=COL[,session=COL][,unit=s|ms|datetime]), "
                         f"got {text!r}")
    if columns is not None:
        if kind != "csv" or spec:
            raise ValueError(f"columns: only with the format csv (its columns), got format {text!r}")
        spec = columns
    if kind != "csv":
        if spec:
            raise ValueError(f"trace format: {kind} has fixed columns; got {text!r}")
        return {"mooncake": MOONCAKE, "azure": AZURE, "burstgpt": BURSTGPT}[kind]
    fields: dict[str, str] = {}
    for part in (p for p in spec.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in ("timestamp", "input", "output", "session", "unit") or not value:
            raise ValueError(f"columns: expected timestamp=COL,input=COL,output=COL[,session=COL][,unit=s|ms|datetime], "
                             f"got {part!r} in {spec!r}")
        if key in fields:
            raise ValueError(f"columns: {key} given twice in {spec!r}")
        fields[key] = value
    missing = [k for k in ("timestamp", "input", "output") if k not in fields]
    if missing:
        raise ValueError(f"columns: {', '.join(missing)} missing: expected timestamp=COL,input=COL,output=COL"
                         f"[,session=COL][,unit=s|ms|datetime], got {spec!r}")
    unit = fields.pop("unit", "s")
    if unit not in TIMESTAMP_UNITS:
        raise ValueError(f"columns: unit: expected one of {list(TIMESTAMP_UNITS)}, got {unit!r}")
    return TraceFormat("csv", fields["timestamp"], fields["input"], fields["output"], fields.get("session"), unit)


_DATETIME = re.compile(r"\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*")
_EPOCH = datetime(1970, 1, 1)


def _datetime_s(text: str) -> float:
    """Seconds since 1970 of a wall-clock time ``YYYY-MM-DD HH:MM:SS[.fraction]`` (no time zone:
    only differences are used); up to 9 fractional digits (Azure's have 7)."""
    m = _DATETIME.fullmatch(text)
    if m is None:
        raise ValueError("expected a time YYYY-MM-DD HH:MM:SS[.fraction]")
    y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
    whole = (datetime(y, mo, d, h, mi, s) - _EPOCH).total_seconds()  # ValueError on a day that does not exist
    frac = m.group(7)
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _number_s(scale: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        v = float(text)
        if not math.isfinite(v):
            raise ValueError("expected a finite number")
        return v * scale
    return parse


_TIME_PARSERS = {"s": _number_s(1.0), "ms": _number_s(1e-3), "datetime": _datetime_s}


def _token_count(text: str, kind: str) -> int:
    """A token count column: a non-negative integer (``12`` or ``12.0``) in ``LIMITS[kind]``."""
    try:
        v = float(text)
    except ValueError:
        raise ValueError("expected an integer number of tokens") from None
    lim = LIMITS[kind]
    if not (math.isfinite(v) and v == int(v) and lim.lo <= v <= lim.hi):
        raise ValueError(f"expected an integer in [{lim.lo}, {lim.hi}] tokens")
    return int(v)


@dataclass(frozen=True)
class Columns:
    """What a CSV trace holds, one entry per request: ``arrival_s`` (seconds from the first request),
    ``input_tokens``, ``output_tokens`` and ``session_ids`` (None when the source has no session)."""

    arrival_s: list
    input_tokens: list
    output_tokens: list
    session_ids: list | None


def read_columns(path: str | os.PathLike, fmt: str | TraceFormat) -> Columns:
    """The requests of a CSV trace ``path`` in format ``fmt`` (see the module docstring)."""
    fmt = parse_format(fmt)
    if fmt.kind == "mooncake":
        raise ValueError("trace format: mooncake is JSONL (mooncake_gym.model.workload.read_trace)")
    path = os.fspath(path)
    check_input_file(path, "trace")
    parse_time = _TIME_PARSERS[fmt.unit]
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    sessions: list[int] = []
    session_of: dict[str, int] = {}
    where_col = None
    with open(path, "rb") as f:  # bytes, so that a line that is not UTF-8 is a TraceFormatError too
        header: list[str] | None = None
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise TraceFormatError(f"{where}: not valid UTF-8 (byte {e.start + 1})") from None
            if not text.strip():
                continue
            try:
                row = next(csv.reader([text]))
            except csv.Error as e:
                raise TraceFormatError(f"{where}: not a CSV row ({e})") from None
            if header is None:
                header = [c.strip() for c in row]
                where_col = _column_indices(header, fmt, where)
                continue
            if len(times) >= MAX_GENERATED_REQUESTS:
                raise TraceFormatError(f"{where}: more than {MAX_GENERATED_REQUESTS:,} requests; cut the file")
            assert where_col is not None
            t_i, in_i, out_i, s_i = where_col
            if len(row) != len(header):
                raise TraceFormatError(f"{where}: expected {len(header)} columns as in the header, got {len(row)}")
            try:
                t = parse_time(row[t_i])
            except ValueError as e:
                raise TraceFormatError(f"{where}: column {header[t_i]!r}: {e}, got {row[t_i]!r}"[:300]) from None
            for i, kind, out in ((in_i, "input_length", inputs), (out_i, "output_length", outputs)):
                try:
                    out.append(_token_count(row[i], kind))
                except ValueError as e:
                    raise TraceFormatError(f"{where}: column {header[i]!r}: {e}, got {row[i].strip()!r}"[:300]) from None
            if times and t < times[-1]:
                raise TraceFormatError(f"{where}: column {header[t_i]!r}: goes backwards ({row[t_i].strip()} is "
                                       f"before the line above); sort the file by it")
            times.append(t)
            if s_i is not None:
                key = row[s_i].strip()
                sessions.append(session_of.setdefault(key, len(session_of)) if key else -1)
    if header is None or not times:
        raise TraceFormatError(f"{path}: the trace has no requests" + ("" if header else " (no header either)"))
    t0 = times[0]
    span = times[-1] - t0
    lim = LIMITS["arrival_s"]
    if span > lim.hi:
        raise TraceFormatError(f"{path}: the trace spans {span:.3g} s, more than {lim.hi:g} s")
    return Columns([t - t0 for t in times], inputs, outputs, sessions if where_col and where_col[3] is not None else None)


def _column_indices(header: list[str], fmt: TraceFormat, where: str) -> tuple:
    """Indices of the timestamp, input, output and session columns in ``header`` (session None when
    the format has none, or, for BurstGPT, when this release has no session column)."""
    wanted = [fmt.timestamp, fmt.input, fmt.output]
    missing = [c for c in wanted if c not in header]
    session = fmt.session
    if fmt.kind == "burstgpt" and BURSTGPT_SESSION in header:
        session = BURSTGPT_SESSION
    if session is not None and session not in header:
        missing.append(session)
    if missing:
        raise TraceFormatError(f"{where}: the {fmt.kind} header lacks the column(s) {missing}; it has {header[:12]}"[:400])
    return (header.index(fmt.timestamp), header.index(fmt.input), header.index(fmt.output),
            None if session is None else header.index(session))
