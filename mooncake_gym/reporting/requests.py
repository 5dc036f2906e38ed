"""One run's requests, one by one: the per-request records of ``replay --per-request`` and ``overload
--per-request`` (CSV or JSONL) and the instance timeline of ``--timeline`` (Chrome's trace-event
format, which Perfetto and ``chrome://tracing`` open).

The rows are read from the records the simulators keep (no bookkeeping of their own):
:class:`~mooncake_gym.sim.cluster.ClusterResult` (a realistic preset), the lecture's
:class:`~mooncake_gym.sim.routing.RoutingResult` (``replay --preset lecture``: prefill only) and
:class:`~mooncake_gym.sim.admission.OverloadResult` (``overload --preset lecture``). A field a
simulator does not have is empty (``None``; an empty CSV cell).

Fields (:data:`FIELDS`), one row per request of the trace in arrival order:

- ``request`` (its index in the trace), ``arrival_s``, ``input_tokens``, ``output_tokens``;
- ``prefill_instance`` (empty if it was never prefilled), ``hit_tokens`` (prompt tokens served from a
  prefix cache, local or pulled), ``computed_tokens`` (the rest, prefilled);
- ``queue_s``: the wait before its prefill. The lecture's routing simulator records it; on the
  cluster and in the lecture's admission problem it is TTFT minus the request's own prefill service
  time (its transfer and prefill alone: what batching and queues added);
- ``ttft_s``; ``decode_instance`` (empty unless it got a decode slot);
- ``mean_tbt_s``: the mean of its token intervals; ``tail_tbt_s``: its TBT as the SLO reads it (the
  mean of its slowest 10 % of intervals; the lecture's fixed time per token there);
- ``outcome`` (:data:`OUTCOMES`; ``prefilled`` in the lecture's routing simulator, which has no
  decode pool); ``policy`` first when several policies run.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os

import numpy as np

from mooncake_gym._files import check_output_file, write_atomic
from mooncake_gym.reporting.plots import request_plots
from mooncake_gym.sim.metrics import Outcome

FIELDS = ("request", "arrival_s", "input_tokens", "output_tokens", "prefill_instance", "hit_tokens", "computed_tokens",
          "queue_s", "ttft_s", "decode_instance", "mean_tbt_s", "tail_tbt_s", "outcome")
#: The ``outcome`` column's words, by the simulators' outcome codes (``sim.metrics.Outcome``).
OUTCOMES = {int(o): o.name.lower() for o in Outcome}
#: The suffixes ``--per-request`` takes.
SUFFIXES = (".csv", ".jsonl")


def _num(x):
    """A float, or None for NaN (not recorded)."""
    x = float(x)
    return None if math.isnan(x) else x


def _instance(k):
    k = int(k)
    return None if k < 0 else k


def request_rows(result, trace) -> list[dict]:
    """The rows of :data:`FIELDS` of ``result``, one simulator's run of ``trace``."""
    n = len(trace)
    arrival = np.asarray(trace.arrival_s, dtype=np.float64)
    inputs = np.asarray(trace.input_tokens, dtype=np.int64)
    outputs = np.asarray(trace.output_tokens, dtype=np.int64)
    if hasattr(result, "prefill_result"):  # the cluster: its prefill pool's rows are its prefilled requests
        cols = _cluster_columns(result, n)
    elif hasattr(result, "decode_end_s"):  # the lecture's admission problem
        cols = _lecture_admission_columns(result, n)
    else:  # the lecture's routing simulator: every request prefilled, no decode pool
        cols = _routing_columns(result, n)
    rows = []
    for i in range(n):
        hit = cols["hit_tokens"][i]
        rows.append({"request": i, "arrival_s": float(arrival[i]), "input_tokens": int(inputs[i]),
                     "output_tokens": int(outputs[i]), "prefill_instance": _instance(cols["prefill_instance"][i]),
                     "hit_tokens": None if hit < 0 else int(hit),
                     "computed_tokens": None if hit < 0 else int(inputs[i] - hit),
                     "queue_s": _num(cols["queue_s"][i]), "ttft_s": _num(cols["ttft_s"][i]),
                     "decode_instance": _instance(cols["decode_instance"][i]),
                     "mean_tbt_s": _num(cols["mean_tbt_s"][i]), "tail_tbt_s": _num(cols["tail_tbt_s"][i]),
                     "outcome": cols["outcome"][i]})
    return rows


def _blank(n: int) -> np.ndarray:
    return np.full(n, math.nan)


def _cluster_columns(r, n: int) -> dict:
    prefilled = r.prefill_instance >= 0
    hit = np.full(n, -1, dtype=np.int64)
    hit[prefilled] = r.prefill_result.hit_tokens  # one row per prefilled request, in order of arrival
    done = r.outcome == Outcome.COMPLETED
    return {"prefill_instance": r.prefill_instance, "hit_tokens": hit, "queue_s": np.maximum(r.ttft_s - r.prefill_s, 0.0),
            "ttft_s": r.ttft_s, "decode_instance": np.where(np.isnan(r.decode_start_s), -1, r.decode_instance),
            "mean_tbt_s": np.where(done, r.mean_tbt_s, math.nan), "tail_tbt_s": np.where(done, r.tbt_s, math.nan),
            "outcome": [OUTCOMES[int(o)] for o in r.outcome]}


def _lecture_admission_columns(r, n: int) -> dict:
    done = r.outcome == Outcome.COMPLETED
    tbt = np.where(done, r.config.tbt_s, math.nan)  # the lecture's decode: a fixed time per token
    return {"prefill_instance": r.prefill_instance, "hit_tokens": np.full(n, -1), "queue_s": np.maximum(r.ttft_s - r.prefill_s, 0.0),
            "ttft_s": r.ttft_s, "decode_instance": r.decode_instance, "mean_tbt_s": tbt, "tail_tbt_s": tbt,
            "outcome": [OUTCOMES[int(o)] for o in r.outcome]}


def _routing_columns(r, n: int) -> dict:
    if len(r.ttft_s) != n:
        raise ValueError(f"per-request: the run has {len(r.ttft_s)} requests, the trace {n}")
    return {"prefill_instance": r.instance, "hit_tokens": r.hit_tokens, "queue_s": r.queue_s, "ttft_s": r.ttft_s,
            "decode_instance": np.full(n, -1), "mean_tbt_s": _blank(n), "tail_tbt_s": _blank(n),
            "outcome": ["prefilled"] * n}


def write_requests(path: str | os.PathLike, runs: dict) -> str:
    """Write the rows of ``runs`` (``{policy: rows}``) to ``path``, CSV or JSONL by its suffix, whole
    or not at all; a ``policy`` column first when ``runs`` holds several policies."""
    path = check_output_file(path, "per-request", SUFFIXES)
    several = len(runs) > 1
    fields = (("policy",) if several else ()) + FIELDS
    rows = [({"policy": name} if several else {}) | row for name, rs in runs.items() for row in rs]
    if path.lower().endswith(".jsonl"):
        text = "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows)
    else:
        out = io.StringIO()
        writer = csv.DictWriter(out, fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in row.items()}
                         for row in rows)
        text = out.getvalue()
    write_atomic(path, text)
    return path


# --- the instance timeline --------------------------------------------------------------------------
def _lanes(spans: list[tuple]) -> list[int]:
    """A lane per span ``(start, end)`` of one instance so that no two spans of a lane overlap (the
    trace-event format nests a thread's slices; a batch's residencies overlap): the lowest free lane,
    in order of start."""
    free_at: list[float] = []
    lanes = [0] * len(spans)
    for k in sorted(range(len(spans)), key=lambda j: (spans[j][0], j)):
        start, end = spans[k]
        lane = next((j for j, t in enumerate(free_at) if t <= start), len(free_at))
        if lane == len(free_at):
            free_at.append(end)
        else:
            free_at[lane] = end
        lanes[k] = lane
    return lanes


#: A thread id per (instance, lane): instance x this + lane (a decode instance runs at most 256 requests)
LANE_STRIDE = 1000


def timeline(runs: dict, trace, rows: dict | None = None) -> dict:
    """The instance timeline of ``runs`` (``{policy: result}``, each a run of ``trace``; ``rows``: their
    :func:`request_rows` if already made) in
    Chrome's trace-event format: a complete event (``"ph": "X"``, ``ts`` and ``dur`` in microseconds)
    per prefill and per decode residency, ``pid`` per pool (prefill, decode; per policy when several
    run), ``tid`` per instance (instance x :data:`LANE_STRIDE` + a lane where the requests of a batch
    overlap), with the processes and threads named."""
    events: list[dict] = []
    several = len(runs) > 1
    for k, (name, result) in enumerate(runs.items()):
        mine = request_rows(result, trace) if rows is None else rows[name]
        prefill = [(r, r["arrival_s"] + r["ttft_s"] - p, p) for r in mine
                   if r["prefill_instance"] is not None and r["ttft_s"] is not None for p in [_prefill_time(result, r)]]
        decode = [(r, *span) for r in mine if r["decode_instance"] is not None
                  for span in [_decode_span(result, r["request"])] if math.isfinite(span[1])]  # (start, duration)
        for pool, spans, key in (("prefill", prefill, "prefill_instance"), ("decode", decode, "decode_instance")):
            if not spans:
                continue
            pid = 2 * k + (1 if pool == "prefill" else 2)
            events.append({"name": "process_name", "ph": "M", "pid": pid,
                           "args": {"name": f"{name}: {pool} pool" if several else f"{pool} pool"}})
            events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
            by_instance: dict[int, list] = {}
            for span in spans:
                by_instance.setdefault(span[0][key], []).append(span)
            for instance in sorted(by_instance):
                spans_of = by_instance[instance]
                lanes = _lanes([(s, s + d) for _, s, d in spans_of])
                for lane in sorted(set(lanes)):
                    tid = instance * LANE_STRIDE + lane
                    label = f"{pool} {instance}" + (f" ({lane + 1})" if lane else "")
                    events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
                for (r, start, dur), lane in zip(spans_of, lanes):
                    args = {"request": r["request"], "input_tokens": r["input_tokens"]}
                    if pool == "prefill":
                        args |= {"hit_tokens": r["hit_tokens"], "ttft_s": r["ttft_s"]}
                    else:
                        args |= {"output_tokens": r["output_tokens"], "tail_tbt_s": r["tail_tbt_s"],
                                 "outcome": r["outcome"]}
                    events.append({"name": f"request {r['request']}", "cat": pool, "ph": "X", "ts": start * 1e6,
                                   "dur": dur * 1e6, "pid": pid, "tid": instance * LANE_STRIDE + lane,
                                   "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _prefill_time(result, row: dict) -> float:
    """A prefilled request's own prefill service time (transfer and prefill), ending at its first token."""
    i = row["request"]
    if hasattr(result, "prefill_result") or hasattr(result, "decode_end_s"):
        return float(result.prefill_s[i])
    return float(result.transfer_s[i] + result.prefill_s[i])


def _decode_span(result, i: int) -> tuple[float, float]:
    """A decode residency's ``(start, duration)``."""
    end = result.decode_end_s[i] if hasattr(result, "decode_end_s") else result.end_s[i]
    return float(result.decode_start_s[i]), float(end - result.decode_start_s[i])


def write_timeline(path: str | os.PathLike, runs: dict, trace, rows: dict | None = None) -> str:
    """Write :func:`timeline` to ``path`` (a ``.json`` file), whole or not at all."""
    path = check_output_file(path, "timeline", (".json",))
    write_atomic(path, json.dumps(timeline(runs, trace, rows), allow_nan=False))
    return path


def write_run_outputs(results: dict, trace, per_request=None, plot_dir=None, timeline_path=None,
                      title: str = "") -> list[str]:
    """``--per-request``, ``--plot-dir`` and ``--timeline`` of ``replay`` and ``overload``: the files of
    ``results`` (``{policy: result}``, each a run of ``trace``) that were asked for (None: not);
    returns the paths written."""
    if per_request is None and plot_dir is None and timeline_path is None:
        return []
    rows = {name: request_rows(r, trace) for name, r in results.items()}
    written = []
    if per_request is not None:
        written.append(write_requests(per_request, rows))
    if plot_dir is not None:
        written += request_plots(rows, {name: r.metrics for name, r in results.items()}, plot_dir, title)
    if timeline_path is not None:
        written.append(write_timeline(timeline_path, results, trace, rows))
    return written
