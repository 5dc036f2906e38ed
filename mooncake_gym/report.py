"""Plain-text and Markdown tables, and JSON output, for every command that prints results."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Sequence

import numpy as np


def _cell(v: Any, fmt: str | None) -> str:
    if v is None:
        return "-"
    if fmt and isinstance(v, (int, float, np.integer, np.floating)):
        return format(v, fmt)
    if isinstance(v, (float, np.floating)):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str | None]], markdown: bool = False) -> str:
    """Render ``rows`` (dicts) as a table; ``columns`` = (key, header, format spec or None)."""
    headers = [h for _, h, _ in columns]
    body = [[_cell(r.get(k), f) for k, _, f in columns] for r in rows]
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


#: Columns of a routing table (lecture demo 2, replay, compare).
ROUTING_COLUMNS = [
    ("policy", "policy", None),
    ("mean_ttft_s", "mean TTFT s", ".2f"),
    ("p90_ttft_s", "P90 s", ".2f"),
    ("slo_attainment", "TTFT<=SLO", ".3f"),
    ("hit_ratio", "hit share", ".3f"),
    ("computed_mtokens", "computed Mtok", ".2f"),
    ("fetched_mtokens", "fetched Mtok", ".2f"),
]


def routing_row(policy: str, metrics: dict) -> dict:
    """A table row of routing metrics (token counts in millions)."""
    row = {"policy": policy, **{k: v for k, v in metrics.items() if not isinstance(v, list)}}
    row["computed_mtokens"] = metrics["computed_tokens"] / 1e6
    row["fetched_mtokens"] = metrics["fetched_tokens"] / 1e6
    return row
