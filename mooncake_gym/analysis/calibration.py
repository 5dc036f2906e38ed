"""Calibration of the realistic cost model, with a validation set held back from the fit.

Three kinds of points, each split into a fit set and a validation set by rules fixed before
fitting (:func:`split`; stated on the generated page):

- ``prefill``: one prefill iteration (``prompt_time`` of Splitwise's profile: ``batch`` prompts of
  ``tokens`` tokens prefilled together; TensorRT-LLM's first-token latency);
- ``decode``: one decode iteration of ``batch`` requests at ``tokens`` of mean context;
- ``all_reduce``: one NCCL all-reduce of ``tokens`` bytes among ``n_gpus`` GPUs.

Data: Splitwise's published profile (Patel et al., ISCA'24; 1,260 rows, read from
``../shared/calibration/splitwise_perf_model.csv`` beside the repository, never copied into it;
``--splitwise PATH`` reads another copy) and the public figures in :data:`POINTS`, each with its
source. Six constants with a physical meaning are fitted to the fit set alone (:func:`fit`): the
linear layers' MFU, the slow engine's attention efficiency, the weights' and the KV's share of HBM
bandwidth, and two engine overheads (``ENGINE_OVERHEAD_S``: Splitwise's engine is ``slow``,
lmdeploy's ``fast``; the fast engine's attention efficiency is FlashAttention-2's published one).
The all-reduce figures are not fitted: they come from nccl-tests (``interconnect.json``).

``python -m mooncake_gym.analysis.calibration --out docs/calibration.md`` writes the page
(atomically); ``tests/test_calibration.py`` regenerates it and compares.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path
from typing import NamedTuple

from mooncake_gym._files import write_atomic
from mooncake_gym.model import costmodel
from mooncake_gym.model.costmodel import CostModel, allreduce_s

SPLITWISE_CSV = Path(__file__).resolve().parents[2].parent / "shared" / "calibration" / "splitwise_perf_model.csv"
#: Most rows read from a profile (the published one has 1,260).
MAX_PROFILE_ROWS = 100_000

SOURCES = {
    "Splitwise": "Mutinifni/splitwise-sim data/perf_model.csv at 8f99e7dc (profile of Patel et al., Splitwise, "
                 "ISCA'24; DGX-A100 / DGX-H100, the authors' engine; median of the runs of each setting)",
    "TRT-LLM v0.5": "NVIDIA TensorRT-LLM docs/source/performance.md, v0.5 'Low Latency, A100 GPUs (FP16)' "
                    "(1st token latency, batch 1)",
    "TRT-LLM v0.9": "NVIDIA TensorRT-LLM performance docs, v0.9.0 'Low Latency, A100 GPUs (FP16)'",
    "lmdeploy": "InternLM/lmdeploy docs/en/benchmark/a100_fp16.md (TurboMind v0.1.0a1, static batch, "
                "P50 token latency)",
    "gpt-fast": "pytorch-labs/gpt-fast README, tensor-parallel table (8x A100-80GB at 330 W, batch 1)",
    "SGLang": "sgl-project/sglang benchmark/benchmark_vllm_060/README.md (SGLang v0.3.0, ShareGPT at 4 "
              "requests/s, median inter-token latency)",
    "nccl-tests#149": "NVIDIA/nccl-tests issue #149: all_reduce_perf, 8x A100-SXM4-80GB over NVSwitch, busbw "
                      "about 200 GB/s at 1 GB",
    "nccl-tests#212": "NVIDIA/nccl-tests issue #212 (NVIDIA's S. Jeaugey): H100 ring all-reduce busbw about "
                      "370 GB/s at large messages",
    "nccl#1374": "NVIDIA/nccl issue #1374: all-reduce busbw 215 GB/s on 8x H800",
    "nccl#583": "NVIDIA/nccl issue #583: all_reduce_perf on 2x A100-SXM4-40GB, 10.14 us at 32 bytes",
    "Mooncake#3484": "kvcache-ai/Mooncake pull request #3484: an all_reduce_perf run on 8x H20 (NVLink4, 900 GB/s "
                     "as H100; out-of-place times)",
}


class Point(NamedTuple):
    """One published measurement. ``kind``: 'prefill' (one iteration prefilling ``batch`` prompts of
    ``tokens`` tokens), 'decode' (one iteration of ``batch`` requests with ``tokens`` of mean
    context) or 'all_reduce' (one all-reduce of ``tokens`` bytes); ``engine``: the serving engine's
    overhead that applies (``'slow'``, ``'fast'``; none for all-reduces)."""

    kind: str
    model: str
    gpu: str
    n_gpus: int
    tokens: int
    batch: int
    measured_ms: float
    source: str
    engine: str = "fast"
    note: str = ""


#: Public figures besides Splitwise's profile (each row with its source in :data:`SOURCES`).
POINTS = (
    Point("prefill", "llama2-70b", "A100", 4, 2048, 1, 377.0, "TRT-LLM v0.5"),
    Point("prefill", "llama2-70b", "A100", 4, 128, 1, 45.6, "TRT-LLM v0.9"),
    Point("prefill", "llama2-70b", "A100", 8, 2048, 1, 249.2, "TRT-LLM v0.9"),
    Point("decode", "llama2-70b", "A100", 4, 2048 + 64, 1, 31.0, "lmdeploy", note="2048 in / 128 out"),
    Point("decode", "llama2-70b", "A100", 4, 3072, 16, 36.0, "lmdeploy", note="2048 in / 2048 out"),
    Point("decode", "llama2-70b", "A100", 4, 3072, 64, 55.0, "lmdeploy", note="2048 in / 2048 out"),
    Point("decode", "llama2-70b", "A100", 8, 5, 1, 16.0, "gpt-fast", note="1 / 62.50 tokens/s"),
    Point("decode", "llama3-70b", "H100", 4, 600, 16, 21.67, "SGLang",
          note="dynamic batch; 16 requests of 600 tokens assumed"),
    # all-reduces: (bytes, measured time)
    Point("all_reduce", "", "A100", 8, 2**30, 1, 2**30 * 1.75 / 200e9 * 1e3, "nccl-tests#149",
          "", "busbw 200 GB/s at 1 GiB"),
    Point("all_reduce", "", "H100", 8, 2**30, 1, 2**30 * 1.75 / 370e9 * 1e3, "nccl-tests#212", "",
          "ring busbw 370 GB/s"),
    Point("all_reduce", "", "H800", 8, 2**30, 1, 2**30 * 1.75 / 215e9 * 1e3, "nccl#1374", "", "busbw 215 GB/s"),
    Point("all_reduce", "", "A100", 2, 32, 1, 10.14e-3, "nccl#583", "", "32 bytes"),
) + tuple(Point("all_reduce", "", "H100", 8, size, 1, us * 1e-3, "Mooncake#3484", "", "8x H20")
          for size, us in ((32768, 18.66), (65536, 18.95), (131072, 19.25), (262144, 19.54), (524288, 20.39),
                           (1048576, 27.76), (2097152, 40.66), (4194304, 53.24), (8388608, 81.16),
                           (16777216, 121.33), (33554432, 195.40), (134217728, 700.25), (268435456, 1366.17),
                           (536870912, 2671.60), (1073741824, 5252.64)))

_HARDWARE = {"a100-80gb": "A100", "h100-80gb": "H100"}

#: The rules that split the points, fixed before fitting (printed on the page).
SPLIT_RULES = (
    "Splitwise's profile: tensor-parallel degree 4 is held back (every TP4 row validates), and so is "
    "BLOOM-176B (every row; the fit sees LLaMA2-70B only); LLaMA2-70B at TP 2 and 8 is the fit set. "
    "Left out before fitting: the power-capped H100 rows (the model has no power cap) and the two TP2 "
    "batch-64 rows whose prompt time is 8x below their batch-32 row (failed runs).",
    "Other engines: lmdeploy's three decode points fit the fast engine's overhead; TensorRT-LLM, "
    "gpt-fast and SGLang validate.",
    "All-reduce: the figures the interconnect table was taken from (busbw at 1 GiB, the 32-byte "
    "latency) are the fit set (they are not fitted: they are the table); every other size of a "
    "published all_reduce_perf run validates.",
)


def read_splitwise(path: str | Path = SPLITWISE_CSV) -> list[Point]:
    """Splitwise's profile as points: the median ``prompt_time`` (a prefill point) and
    ``token_time`` (a decode point at the mean context ``prompt + tokens / 2``) of each setting,
    slow engine, power-capped rows left out. ``ValueError`` names ``path`` on a malformed file."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i >= MAX_PROFILE_ROWS:
                raise ValueError(f"splitwise: expected at most {MAX_PROFILE_ROWS:,} rows in {path}")
            try:
                gpu = _HARDWARE.get(row["hardware"])
                key = (row["model"], gpu, int(row["tensor_parallel"]), int(row["prompt_size"]),
                       int(row["batch_size"]), int(row["token_size"]))
                times = (float(row["prompt_time"]), float(row["token_time"]))
            except (KeyError, ValueError, TypeError) as e:
                raise ValueError(f"splitwise: row {i + 2} of {path} is not a Splitwise profile row: {e}") from None
            if gpu is not None:
                groups.setdefault(key, []).append(times)
    points = []
    for (model, gpu, tp, prompt, batch, out), times in sorted(groups.items()):
        prefill = statistics.median(t for t, _ in times)
        decode = statistics.median(t for _, t in times)
        note = f"{prompt} in / {out} out"
        points.append(Point("prefill", model, gpu, tp, prompt, batch, prefill, "Splitwise", "slow", note))
        points.append(Point("decode", model, gpu, tp, prompt + out // 2, batch, decode, "Splitwise", "slow", note))
    return _drop_failed(points)


def _drop_failed(points: list[Point]) -> list[Point]:
    """The rules' exclusions: a prefill whose time is below 1/4 of the same setting at half the batch."""
    prefill = {(p.model, p.gpu, p.n_gpus, p.tokens, p.batch): p.measured_ms for p in points if p.kind == "prefill"}
    bad = set()
    for (model, gpu, tp, tokens, batch), ms in prefill.items():
        half = prefill.get((model, gpu, tp, tokens, batch // 2))
        if batch > 1 and half is not None and ms < half / 4:
            bad.add((model, gpu, tp, batch))
    return [p for p in points if (p.model, p.gpu, p.n_gpus, p.batch) not in bad]


def split(point: Point) -> str:
    """``'fit'`` or ``'validation'`` by :data:`SPLIT_RULES` (nothing measured is looked at)."""
    if point.kind == "all_reduce":
        return "fit" if point.source != "Mooncake#3484" else "validation"
    if point.source == "Splitwise":
        return "fit" if point.model == "llama2-70b" and point.n_gpus in (2, 8) else "validation"
    return "fit" if point.source == "lmdeploy" else "validation"


#: The fitted constants: (name, InstanceSpec field or engine, lower bound, upper bound).
PARAMETERS = (
    ("mfu", 0.2, 1.0),
    ("slow_attention_efficiency", 0.02, 1.0),
    ("memory_efficiency", 0.3, 0.9),
    ("kv_read_efficiency", 0.05, 1.0),
    ("slow", 0.0, 0.1),
    ("fast", 0.0, 0.05),
)


def current_parameters() -> dict:
    """The constants the package uses (``costmodel.REALISTIC_*`` and ``ENGINE_OVERHEAD_S``)."""
    return {"mfu": costmodel.REALISTIC_MFU,
            "slow_attention_efficiency": costmodel.ENGINE_ATTENTION_EFFICIENCY["slow"],
            "memory_efficiency": costmodel.REALISTIC_MEMORY_EFFICIENCY,
            "kv_read_efficiency": costmodel.REALISTIC_KV_READ_EFFICIENCY,
            "slow": costmodel.ENGINE_OVERHEAD_S["slow"], "fast": costmodel.ENGINE_OVERHEAD_S["fast"]}


def model_ms(point: Point, params: dict | None = None) -> float:
    """The realistic cost model's figure for ``point`` in ms, with ``params`` (default: the package's)."""
    if point.kind == "all_reduce":
        return 1e3 * allreduce_s(point.gpu, point.n_gpus, point.tokens)
    q = current_parameters() if params is None else params
    attention = q["slow_attention_efficiency"] if point.engine == "slow" else costmodel.ENGINE_ATTENTION_EFFICIENCY[
        point.engine]
    cost = CostModel.realistic(point.model, point.gpu, point.n_gpus, mfu=q["mfu"], attention_efficiency=attention,
                               memory_efficiency=q["memory_efficiency"], kv_read_efficiency=q["kv_read_efficiency"],
                               iteration_overhead_s=q[point.engine])
    if point.kind == "prefill":
        parts = cost.iteration_breakdown(point.batch * point.tokens, 0, point.batch)
        return 1e3 * (sum(parts.values()) + point.batch * cost.instance.prefill_overhead_s)
    return 1e3 * cost.decode_step_s(point.batch, point.batch * point.tokens)


def _loss(points: list[Point], params: dict) -> float:
    return sum(math.log(model_ms(p, params) / p.measured_ms) ** 2 for p in points)


#: Where :func:`fit` starts: the constants before this calibration (docs/calibration.md of 0.2).
FIT_START = {"mfu": 0.65, "slow_attention_efficiency": 0.25, "memory_efficiency": 0.7, "kv_read_efficiency": 0.35,
             "slow": 0.02, "fast": 0.004}


def fit(points: list[Point], rounds: int = 4, steps: int = 18) -> dict:
    """The constants of :data:`PARAMETERS` minimising the squared log errors of the fit set's
    prefill and decode points: ``rounds`` of coordinate descent from :data:`FIT_START`, each
    coordinate by ``steps`` golden-section steps within its bounds; rounded to 3 significant figures
    (the package's constants are this function's result on the published data: tested)."""
    train = [p for p in points if split(p) == "fit" and p.kind != "all_reduce"]
    params = dict(FIT_START)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(rounds):
        for name, lo, hi in PARAMETERS:
            a, b = lo, hi
            for _ in range(steps):
                c, d = b - g * (b - a), a + g * (b - a)
                fc = _loss(train, {**params, name: c})
                fd = _loss(train, {**params, name: d})
                if fc <= fd:
                    b = d
                else:
                    a = c
            params[name] = (a + b) / 2
    return {k: float(f"{v:.3g}") for k, v in params.items()}


def table(points: list[Point], params: dict | None = None) -> list[dict]:
    """One row per point: the measurement, the model's figure, the relative error and the split."""
    return [{**p._asdict(), "model_ms": (m := model_ms(p, params)), "error": m / p.measured_ms - 1, "split": split(p)}
            for p in points]


def summary(rows: list[dict]) -> list[dict]:
    """Per kind and split: the number of points, the median and the worst absolute relative error."""
    out = []
    for kind in ("prefill", "decode", "all_reduce"):
        for part in ("fit", "validation"):
            errors = [abs(r["error"]) for r in rows if r["kind"] == kind and r["split"] == part]
            if errors:
                out.append({"kind": kind, "split": part, "n": len(errors), "median": statistics.median(errors),
                            "worst": max(errors)})
    return out


def all_points(splitwise: str | Path | None = SPLITWISE_CSV) -> list[Point]:
    """Splitwise's profile (when ``splitwise`` is a file) and :data:`POINTS`."""
    return (read_splitwise(splitwise) if splitwise is not None else []) + list(POINTS)


def markdown(points: list[Point]) -> str:
    """The page ``docs/calibration.md``: the split rules, the fitted constants (refitted here and
    compared with the package's), the error summary per kind and split, and every point."""
    fitted = fit(points)
    used = current_parameters()
    rows = table(points)
    lines = ["# Calibration of the realistic cost model", "",
             "Generated by `python -m mooncake_gym.analysis.calibration --out docs/calibration.md`; "
             "`tests/test_calibration.py` regenerates it and compares. The model "
             "(`CostModel.iteration_breakdown`) is one forward iteration as linear layers (max of FLOPs at "
             "`mfu` and the weights' read at `memory_efficiency`), attention (max of its FLOPs at "
             "`attention_efficiency x mfu` and the KV read at `kv_read_efficiency`), element-wise traffic, "
             "two NCCL all-reduces per layer (latency + bytes / busbw from `interconnect.json`, not fitted) "
             "and the engine's overhead per iteration; a prefill adds 20 ms per request (an assumption, "
             "not fitted). The fast engine's attention efficiency (FlashAttention-2's published share of "
             f"peak, {costmodel.ENGINE_ATTENTION_EFFICIENCY['fast']:g} of `mfu`) is not fitted either.", "",
             "## Fit set and validation set (chosen before fitting)", ""]
    lines += [f"- {rule}" for rule in SPLIT_RULES]
    lines += ["", "## Fitted constants (the fit set only)", "",
              "| constant | fitted here | in the package |", "|---|---|---|"]
    for name, _, _ in PARAMETERS:
        label = f"engine overhead `{name}` (s)" if name in ("slow", "fast") else f"`{name}`"
        lines.append(f"| {label} | {fitted[name]:.3g} | {used[name]:.3g} |")
    lines += ["", "## Errors: median and worst |model / measured - 1|", "",
              "| kind | set | points | median | worst |", "|---|---|---|---|---|"]
    for s in summary(rows):
        lines.append(f"| {s['kind']} | {s['split']} | {s['n']} | {s['median']:.1%} | {s['worst']:.1%} |")
    lines += ["", "Target on the validation set: median within 15 %, worst within 40 %.", "",
              "## Every point", "",
              "| set | kind | model | GPUs (TP) | tokens / bytes | batch | engine | measured (ms) | model (ms) | error "
              "| source |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["kind"], r["split"], r["source"], r["model"], r["gpu"], r["n_gpus"],
                                         r["batch"], r["tokens"])):
        note = f" ({r['note']})" if r["note"] else ""
        engine = r["engine"] if r["kind"] != "all_reduce" else "-"
        lines.append(f"| {r['split']} | {r['kind']} | {r['model'] or '-'} | {r['n_gpus']}x {r['gpu']} | "
                     f"{r['tokens']:,} | {r['batch']} | {engine} | {r['measured_ms']:.4g} | {r['model_ms']:.4g} | "
                     f"{r['error']:+.0%} | {r['source']}{note} |")
    lines += ["", "## Sources", ""] + [f"- {k}: {v}" for k, v in SOURCES.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mooncake_gym.analysis.calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the page here (atomically) instead of printing it")
    ap.add_argument("--splitwise", default=str(SPLITWISE_CSV), help="Splitwise's perf_model.csv")
    args = ap.parse_args(argv)
    if not Path(args.splitwise).is_file():
        ap.error(f"--splitwise: expected Splitwise's perf_model.csv, no file at {args.splitwise}")
    page = markdown(all_points(args.splitwise))
    if args.out:
        write_atomic(args.out, page)
    else:
        print(page, end="")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
