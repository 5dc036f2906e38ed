"""Calibration of the realistic cost model against public measurements.

``POINTS`` holds published prefill and decode latencies (model, GPUs, tensor-parallel degree,
tokens, batch) with their sources; :func:`table` computes the cost model's figure for each and its
relative error. ``python -m mooncake_gym.analysis.calibration`` prints the table that ``docs/calibration.md``
carries. All points are BF16/FP16 measurements of single requests or static batches (no queueing).

Caveat: the model's free constants (MFU, memory efficiency, iteration overhead, all-reduce bus
bandwidth) were chosen with these points in view, so the errors are in-sample fits, not
predictions; the points disagree with each other by more than 25 % in places (batch-1 decode of
LLaMA2-70B on TP8 A100: 16.0 ms with gpt-fast, 44.8 ms in Splitwise's profile).
"""

from __future__ import annotations

from typing import NamedTuple

from mooncake_gym.model.costmodel import CostModel

SOURCES = {
    "TRT-LLM v0.5": "NVIDIA TensorRT-LLM docs/source/performance.md, v0.5 'Low Latency, A100 GPUs (FP16)' "
                    "(1st token latency, batch 1)",
    "TRT-LLM v0.9": "NVIDIA TensorRT-LLM performance docs, v0.9.0 'Low Latency, A100 GPUs (FP16)'",
    "lmdeploy": "InternLM/lmdeploy docs/en/benchmark/a100_fp16.md (TurboMind v0.1.0a1, static batch, "
                "P50 token latency / mean first-token latency)",
    "gpt-fast": "pytorch-labs/gpt-fast README, tensor-parallel table (8x A100-80GB at 330 W, batch 1)",
    "Splitwise": "Mutinifni/splitwise-sim data/perf_model.csv (profile of Patel et al., Splitwise, ISCA'24; "
                 "DGX-A100 / DGX-H100, batch 1, median of 5 runs)",
    "SGLang": "sgl-project/sglang benchmark/benchmark_vllm_060/README.md (SGLang v0.3.0, ShareGPT at 4 "
              "requests/s, median inter-token latency)",
}


class Point(NamedTuple):
    """One published measurement: ``kind`` 'prefill' (time of a ``tokens``-token prompt) or 'decode'
    (time of one iteration of ``batch`` requests with ``tokens`` of context each)."""

    kind: str
    model: str
    gpu: str
    n_gpus: int
    tokens: int
    batch: int
    measured_ms: float
    source: str
    note: str = ""


POINTS = (
    Point("prefill", "llama2-70b", "A100", 4, 2048, 1, 377.0, "TRT-LLM v0.5"),
    Point("prefill", "llama2-70b", "A100", 4, 128, 1, 45.6, "TRT-LLM v0.9"),
    Point("prefill", "llama2-70b", "A100", 8, 2048, 1, 249.2, "TRT-LLM v0.9"),
    Point("prefill", "llama2-70b", "A100", 8, 4096, 1, 654.0, "Splitwise"),
    Point("prefill", "llama2-70b", "A100", 8, 8192, 1, 1549.8, "Splitwise"),
    Point("prefill", "llama2-70b", "H100", 8, 2048, 1, 136.7, "Splitwise"),
    Point("prefill", "llama2-70b", "H100", 8, 8192, 1, 844.9, "Splitwise"),
    Point("decode", "llama2-70b", "A100", 4, 2048 + 64, 1, 31.0, "lmdeploy", "2048 in / 128 out"),
    Point("decode", "llama2-70b", "A100", 4, 3072, 16, 36.0, "lmdeploy", "2048 in / 2048 out: mean context 3,072"),
    Point("decode", "llama2-70b", "A100", 4, 3072, 64, 55.0, "lmdeploy", "2048 in / 2048 out: mean context 3,072"),
    Point("decode", "llama2-70b", "A100", 8, 5, 1, 16.0, "gpt-fast", "derived: 1 / 62.50 tokens/s"),
    Point("decode", "llama2-70b", "A100", 8, 512 + 64, 1, 44.8, "Splitwise", "512 in / 128 out"),
    Point("decode", "llama3-70b", "H100", 4, 600, 16, 21.67, "SGLang",
          "dynamic batch; batch and context not published: 16 requests of 600 tokens assumed"),
)


def model_ms(point: Point, cost: CostModel | None = None) -> float:
    """The realistic cost model's figure for ``point``, in ms."""
    c = cost if cost is not None else CostModel.realistic(point.model, point.gpu, point.n_gpus)
    if point.kind == "prefill":
        return 1e3 * c.prefill_s(point.tokens, 0)
    return 1e3 * c.decode_step_s(point.batch, point.batch * point.tokens)


def table() -> list[dict]:
    """One row per point: the measurement, the model's figure and the relative error."""
    rows = []
    for p in POINTS:
        m = model_ms(p)
        rows.append({**p._asdict(), "model_ms": m, "error": m / p.measured_ms - 1})
    return rows


def markdown() -> str:
    lines = ["| kind | model | GPUs (TP) | tokens | batch | measured (ms) | model (ms) | error | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table():
        note = f" ({r['note']})" if r["note"] else ""
        lines.append(f"| {r['kind']} | {r['model']} | {r['n_gpus']}x {r['gpu']} | {r['tokens']:,} | {r['batch']} | "
                     f"{r['measured_ms']:g} | {r['model_ms']:.1f} | {r['error']:+.0%} | {r['source']}{note} |")
    lines += ["", "Sources:", ""] + [f"- {k}: {v}" for k, v in SOURCES.items()]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(markdown())
