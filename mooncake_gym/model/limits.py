"""The finite range of every numeric parameter and trace field, and the one checker of a range.

Every number that comes from outside (a trace line, a command-line argument, an environment or
simulator argument) is checked against the range named here before any work starts, and every loop
whose length follows from input (the synthetic generator's sessions, the load series' samples, the
decode-time tables sized by the longest output) has its length bounded here and checked before it
runs. A value outside its range is a ``ValueError`` naming the parameter and the range;
``docs/reliability.md`` lists the same table.

The bounds are generous for the modelled systems (Mooncake's public traces: prompts up to a few
hundred thousand tokens, outputs of a few thousand, hours of arrivals) and small enough that the
largest admissible run fits in a few GB and ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Limit:
    """A closed range ``[lo, hi]`` (``hi=None``: no upper bound needed), integer or real, with its unit."""

    lo: float
    hi: float | None
    integer: bool
    unit: str


#: Largest integer id (block hash ids, session ids): ids are stored as int64.
MAX_ID = 2**63 - 1
#: Longest prompt, tokens (2 M; the longest context windows of 2024-2025 models are 1-2 M tokens).
MAX_INPUT_TOKENS = 2_000_000
#: Longest output, tokens. The admission simulator's decode-time tables have one entry per token of
#: the longest output (8 bytes each), so this bounds them to a few tens of MB.
MAX_OUTPUT_TOKENS = 1_000_000
#: Latest arrival, milliseconds from the trace's start (10^12 ms, about 31.7 years).
MAX_TIMESTAMP_MS = 10**12
#: Requests the synthetic generator or i.i.d. resampling may produce in one trace.
MAX_GENERATED_REQUESTS = 2_000_000
#: Sessions the synthetic generator may draw for a duration (``rate x duration_s``): about 2.1
#: requests each with the default distributions. 200,000 sessions take about 10 s and 0.7 GB to
#: build (a 1,000 sessions/s base of 600 s, 600,000 sessions, took 31 s and 2.1 GB, whatever was then
#: drawn from it); the documented workloads use fewer than 10,000.
MAX_SYNTHETIC_SESSIONS = 200_000
#: Samples of the admission simulator's load series (trace span / ``sample_period_s``).
MAX_LOAD_SAMPLES = 1_000_000
#: Load snapshots a router of the ``scraped`` observation mode holds at once (``scrape_delay_s /
#: scrape_period_s + 1``, each one load per instance), and so takes at a decision at most.
MAX_SCRAPE_SNAPSHOTS = 100_000
#: Parameters of an agent file's network, bounded from its card (its layer sizes multiplied out,
#: every network of the algorithm's policy counted) before anything is built or read: 16 M float32
#: parameters, 64 MB; the shipped agents have fewer than 40,000.
MAX_AGENT_PARAMETERS = 16_000_000
#: Entries of an agent's observations (the product of its Box shape) and actions of its Discrete space.
MAX_AGENT_OBSERVATION = 1_000_000
MAX_AGENT_ACTIONS = 65_536

LIMITS: dict[str, Limit] = {
    # trace fields (one JSONL line; Trace columns)
    "timestamp": Limit(0, MAX_TIMESTAMP_MS, True, "ms"),
    "arrival_s": Limit(0, MAX_TIMESTAMP_MS / 1000, False, "s"),
    "input_length": Limit(0, MAX_INPUT_TOKENS, True, "tokens"),
    "output_length": Limit(0, MAX_OUTPUT_TOKENS, True, "tokens"),
    "hash_ids": Limit(0, MAX_ID, True, "id"),
    "session_id": Limit(-1, MAX_ID, True, "id (-1: unknown)"),
    "block_tokens": Limit(1, 1 << 20, True, "tokens per prefix block"),
    # workloads
    "rate": Limit(1e-6, 1e5, False, "sessions/s (synthetic) or requests/s (resampling)"),
    "speed": Limit(1e-6, 1e6, False, "x"),
    "duration_s": Limit(1e-6, 1e8, False, "s"),
    "requests": Limit(1, MAX_GENERATED_REQUESTS, True, "requests"),
    "load": Limit(1e-3, 1e3, False, "x decode capacity rate"),
    "seed": Limit(0, 2**63 - 1, True, ""),
    # routing cluster
    "n_instances": Limit(1, 1024, True, "instances"),
    "cache_blocks": Limit(0, 10**9, True, "blocks"),
    "ttft_slo_s": Limit(1e-6, 1e6, False, "s"),
    "threshold": Limit(0, 1e6, False, "ratio (kvcentric's kvcache_balancing_threshold)"),
    # admission cluster
    "n_prefill": Limit(1, 1024, True, "instances"),
    "n_decode": Limit(1, 1024, True, "instances"),
    "decode_capacity_tokens": Limit(1, 10**10, True, "tokens"),
    "tbt_s": Limit(1e-6, 10, False, "s per token"),
    "sample_period_s": Limit(1e-3, 1e6, False, "s"),
    "recent_window_s": Limit(1e-6, 1e8, False, "s"),
    "warmup_s": Limit(0, 1e8, False, "s"),
    "waste_penalty": Limit(0, 1e6, False, "per mean prefill"),
    # observation modes (sim/observation.py): scrape period and delay, KV-event delay, index TTL
    "observation_s": Limit(0, 1e8, False, "s"),
    "noise_sigma": Limit(0, 10, False, "log-normal sigma of the predicted times' error"),
    # cache analysis
    "blocks": Limit(1, 10**10, True, "blocks"),
    "gib": Limit(1e-9, 1e9, False, "GiB"),
    # preset files (mooncake_gym.model.presets.load_preset_file): a GPU's figures, a model's shape, an instance's
    # efficiencies and overheads, the engine's mechanisms
    "peak_flops": Limit(1e9, 1e18, False, "FLOP/s per GPU"),
    "hbm_bytes": Limit(2**20, 2**50, True, "bytes per GPU"),
    "hbm_bandwidth": Limit(1e6, 1e15, False, "bytes/s per GPU"),
    "busbw": Limit(1e6, 1e15, False, "bytes/s (all-reduce bus bandwidth)"),
    "allreduce_latency_s": Limit(0, 1, False, "s per all-reduce"),
    "model_layers": Limit(1, 10_000, True, "layers"),
    "model_width": Limit(1, 10**6, True, "units"),
    "model_heads": Limit(1, 10**4, True, "heads"),
    "vocab": Limit(1, 10**8, True, "tokens"),
    "mlp_matrices": Limit(2, 3, True, "matrices (2: GELU MLP, 3: gated)"),
    "n_gpus": Limit(1, 8, True, "GPUs per instance (one node)"),
    "efficiency": Limit(1e-6, 1, False, "share of peak"),
    "memory_reserve": Limit(0, 0.99, False, "share of GPU memory"),
    "overhead_s": Limit(0, 1, False, "s"),
    "chunk_tokens": Limit(1, 10**7, True, "tokens"),
    "prefill_token_budget": Limit(0, 10**7, True, "tokens per iteration (0: one request at a time)"),
    "pipeline_nodes": Limit(1, 1024, True, "instances"),
    "pipeline_min_tokens": Limit(0, 10**9, True, "tokens"),
    "max_running": Limit(1, 10**6, True, "requests"),
    # command line
    "seeds": Limit(1, 1000, True, "seeds"),
    "timesteps": Limit(1, 10**9, True, "steps"),
    "threads": Limit(1, 256, True, "threads"),
    "n_envs": Limit(1, 256, True, "environments"),
    "seconds": Limit(1e-3, 3600, False, "s"),
}


def check_range(name: str, value, lo=None, hi=None, integer: bool = False, allow_none: bool = False):
    """Raise ``ValueError`` naming ``name`` unless ``lo <= value <= hi`` (and an integer if asked).

    The value must be finite: an infinite rate or duration would make the workload generator loop
    forever."""
    if value is None and allow_none:
        return value
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) if integer else \
        isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok and isinstance(value, int):  # exact: math.isfinite would raise OverflowError beyond float range
        ok = integer or -2**1023 < value < 2**1023
    elif ok and not math.isfinite(value):
        ok = False
    if ok and lo is not None and not value >= lo:
        ok = False
    if ok and hi is not None and not value <= hi:
        ok = False
    if not ok:
        kind = "an integer" if integer else "a finite number"
        bounds = f" in [{lo}, {hi}]" if lo is not None and hi is not None else \
            f" in [{lo}, inf)" if lo is not None else f" in (-inf, {hi}]" if hi is not None else ""
        got = repr(value)
        raise ValueError(f"{name}: expected {kind}{bounds}, got {got if len(got) <= 40 else got[:37] + '...'}")
    return value


def check(kind: str, value, name: str | None = None, allow_none: bool = False):
    """Check ``value`` against the range of :data:`LIMITS` ``[kind]``; the error names ``name``
    (default ``kind``) and the range."""
    lim = LIMITS[kind]
    return check_range(name or kind, value, lim.lo, lim.hi, lim.integer, allow_none)


def check_bound(name: str, count: float, limit: int, what: str, advice: str) -> None:
    """Refuse, before a loop runs, a ``count`` of ``what`` beyond ``limit`` (``name`` is the
    parameter to change, ``advice`` how)."""
    if not count <= limit:
        raise ValueError(f"{name}: this would make {count:.3g} {what}, more than the limit of {limit:,}; {advice}")
