"""Plain-text and Markdown tables, and JSON output, for every command that prints results."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Sequence

import numpy as np

# the problems' table columns and rows live in the problem registry; these names are kept here
from mooncake_gym.evaluation.problems import (ADMISSION_COLUMNS, ADMISSION_V1_COLUMNS,  # noqa: F401
                                              OVERLOAD_COLUMNS, ROUTING_COLUMNS, overload_row, routing_row)


def format_cell(v: Any, fmt: str | None = None) -> str:
    """One table cell: ``fmt`` for numbers if given; else floats with 4 significant digits (one
    decimal with thousands separators from 1,000 on); ``None`` as '-'."""
    if v is None:
        return "-"
    if fmt and isinstance(v, (int, float, np.integer, np.floating)):
        return format(v, fmt)
    if isinstance(v, (float, np.floating)):
        if math.isnan(v):
            return "nan"
        return f"{v:,.1f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str | None]], markdown: bool = False) -> str:
    """Render ``rows`` (dicts) as a table; ``columns`` = (key, header, format spec or None)."""
    headers = [h for _, h, _ in columns]
    body = [[format_cell(r.get(k), f) for k, _, f in columns] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for row in body:
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(out)


def to_jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays, dataclass-like objects and NaN into JSON-friendly values."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    return obj


def print_json(obj: Any, file=None) -> None:
    """Print one JSON document on stdout (the only output of a command run with --json)."""
    json.dump(to_jsonable(obj), file or sys.stdout, indent=2)
    (file or sys.stdout).write("\n")


def cache_table(analysis) -> str:
    """The table the command prints; a ``*`` marks a figure whose cache was not yet full when the
    measured window began (kvcache-simulator omits such points)."""
    rows = []
    marked = False
    for pt in analysis.points:
        row = {"blocks": f"{pt.capacity_blocks:,}", "gib": f"{pt.capacity_gib:,.2f}"}
        for p in analysis.policies:
            res = pt.results[p]
            star = res.full_before_window is False
            marked |= star
            row[p] = f"{res.hit_rate:.4f}" + ("*" if star else "")
        rows.append(row)
    rows.append({"blocks": "infinite", "gib": "-", **{p: f"{analysis.ceiling.hit_rate:.4f}" for p in analysis.policies}})
    cols = [("blocks", "cache blocks", None), ("gib", f"GiB ({analysis.model})", None)]
    cols += [(p, p, None) for p in analysis.policies]
    text = format_table(rows, cols)
    if marked:
        text += "\n* the cache was not yet full when the measured window began (kvcache-simulator omits such points)"
    return text
