"""The course lecture's three demos (``shared/spec/lecture.md``), reproduced with our simulators.

Each demo function returns ``(data, text)``: a JSON-ready dict and the printed report.
"""

from __future__ import annotations

from .costmodel import CostModel
from . import report

DEMO1_SETUPS = (("llama2-70b", "A800", 8), ("opt-13b", "A100", 1))
DEMO1_TIERS = ("dram", "ssd", "rdma")
DEMO1_REQUEST = (8704, 4352)  # input tokens, cached prefix tokens


def demo1():
    """Demo 1: trade storage for compute — read KV back versus recompute, per token."""
    per_token, rows_text = [], []
    for model, gpu, n_gpus in DEMO1_SETUPS:
        cost = CostModel.preset(model, gpu, n_gpus)
        recompute = cost.recompute_s_per_token(8192)
        row = {
            "model": cost.model.name,
            "hardware": f"{n_gpus}x {gpu}",
            "params_b": cost.model.n_params / 1e9,
            "kv_bytes_per_token": cost.model.kv_bytes_per_token,
            "recompute_gflop_per_token": cost.model.prefill_flops(8192) / 8192 / 1e9,
            "recompute_us_per_token": recompute * 1e6,
        }
        for tier in DEMO1_TIERS:
            load = cost.load_s(1, tier)
            row[f"{tier}_load_us_per_token"] = load * 1e6
            row[f"{tier}_speedup"] = recompute / load
        per_token.append(row)
    cols = [("model", "model", None), ("hardware", "hardware", None), ("kv_bytes_per_token", "KV B/token", ",d"),
            ("recompute_gflop_per_token", "GFLOP/token", ".1f"), ("recompute_us_per_token", "recompute us", ".2f")]
    for tier in DEMO1_TIERS:
        cols += [(f"{tier}_load_us_per_token", f"{tier} us", ".2f"), (f"{tier}_speedup", f"{tier} x", ".1f")]
    rows_text.append("Per token: recompute (8,192-token prompt, no cache) versus reading the KV back")
    rows_text.append(report.format_table(per_token, cols))

    n, h = DEMO1_REQUEST
    cost = CostModel.preset("llama2-70b", "A800", 8)
    request = {"input_tokens": n, "cached_tokens": h, "no_cache_s": cost.prefill_s(n, 0),
               "compute_uncached_s": cost.compute_s(n, h), "tiers": []}
    for tier in DEMO1_TIERS:
        request["tiers"].append({
            "tier": tier,
            "load_s": cost.load_s(h, tier),
            "overlap_s": cost.prefill_s(n, h, tier, overlap=True),
            "no_overlap_s": cost.prefill_s(n, h, tier, overlap=False),
        })
    rows_text.append("")
    rows_text.append(f"One {n:,}-token request with a {h:,}-token cached prefix (LLaMA2-70B, 8x A800): "
                     f"no cache {request['no_cache_s']:.3f} s, compute of the {n - h:,} uncached tokens "
                     f"{request['compute_uncached_s']:.3f} s")
    rows_text.append(report.format_table(request["tiers"], [
        ("tier", "tier", None), ("load_s", "load s", ".4f"), ("overlap_s", "layer-wise overlap s", ".4f"),
        ("no_overlap_s", "load then compute s", ".4f")]))
    llama, opt = per_token
    rows_text += [
        "",
        f"- {llama['model']}: {llama['kv_bytes_per_token'] / 1024:.0f} KB of KV per token (GQA), "
        f"{llama['recompute_gflop_per_token']:.0f} GFLOP to recompute it: reading back is "
        f"{min(llama[f'{t}_speedup'] for t in DEMO1_TIERS):.0f}x-{max(llama[f'{t}_speedup'] for t in DEMO1_TIERS):.0f}x "
        "faster than recomputing from every tier (trade storage for compute).",
        f"- {opt['model']} (MHA) on {opt['hardware']}: {opt['kv_bytes_per_token'] / 1000:.0f} KB per token; DRAM "
        f"{opt['dram_speedup']:.1f}x, RDMA {opt['rdma_speedup']:.1f}x, SSD {opt['ssd_speedup']:.2f}x "
        "(slower than recomputing): whether slow tiers pay depends on the architecture.",
        "- With layer-wise overlap the load hides behind compute: "
        + ", ".join(f"{t['tier']} {t['overlap_s'] / request['compute_uncached_s'] - 1:+.1%}" for t in request["tiers"])
        + " over pure compute.",
    ]
    return {"per_token": per_token, "request": request}, "\n".join(rows_text)


DEMO2_RATES = (4.0, 8.0)


def demo2():
    """Demo 2: which prefill instance gets the request — Mooncake Algorithm 1 versus simpler routers."""
    from .routing import RoutingConfig, run_routing_baselines
    from .workload import synthetic_trace

    config = RoutingConfig()
    data, text = {"config": {"n_instances": config.n_instances, "cache_blocks": config.cache_blocks,
                             "ttft_slo_s": config.ttft_slo_s}, "rates": []}, []
    for rate in DEMO2_RATES:
        trace = synthetic_trace(0, rate)
        results = run_routing_baselines(trace, config=config, seed=0)
        rows = [report.routing_row(name, r.metrics) for name, r in results.items()]
        data["rates"].append({"session_rate": rate, "requests": len(trace), "request_rate_per_s": trace.rate,
                              "results": {n: r.metrics for n, r in results.items()}})
        text.append(f"Session rate {rate:g}/s (seed 0): {len(trace):,} requests, mean request rate "
                    f"{trace.rate:.2f}/s; {config.n_instances} instances x {config.cache_blocks:,} blocks, "
                    f"TTFT SLO {config.ttft_slo_s:g} s")
        text.append(report.format_table(rows, report.ROUTING_COLUMNS))
        text.append("")
    hi = data["rates"][-1]["results"]
    text += [
        f"- random and load scatter a document's requests over {config.n_instances} instances: each local cache "
        f"hits only {hi['random']['hit_ratio']:.0%} / {hi['load']['hit_ratio']:.0%} of input tokens, much is "
        "recomputed and queues grow under load.",
        f"- cache (estimated TTFT per instance, argmin) sends later requests to the instance that holds the prefix: "
        f"hit share {hi['cache']['hit_ratio'] / hi['random']['hit_ratio']:.1f}x random's, "
        f"{1 - hi['cache']['computed_tokens'] / hi['random']['computed_tokens']:.0%} fewer tokens computed, "
        f"mean TTFT {hi['random']['mean_ttft_s'] / hi['cache']['mean_ttft_s']:.0f}x lower at the high rate.",
        f"- kvcentric pulls hot prefixes over RDMA ({hi['kvcentric']['fetched_tokens'] / 1e6:.1f} M tokens fetched) "
        f"and replicates them: mean TTFT {hi['kvcentric']['mean_ttft_s']:.2f} s against cache's "
        f"{hi['cache']['mean_ttft_s']:.2f} s. The ordering matches Mooncake's Figure 8.",
    ]
    return data, "\n".join(text)


def demo3(plot=None):
    """Demo 3: early rejection under overload — Mooncake §7, Table 3 and Figure 9."""
    from .overload import lecture_demo3

    return lecture_demo3(plot)


DEMOS = {1: demo1, 2: demo2, 3: demo3}


def run_lecture(args) -> int:
    demos = [args.demo] if args.demo else sorted(DEMOS)
    missing = [d for d in demos if d not in DEMOS]
    if missing:
        raise ValueError(f"--demo: demo {missing[0]} is not built yet; available: {sorted(DEMOS)}")
    results = {}
    for d in demos:
        kwargs = {"plot": args.plot} if d == 3 else {}
        data, text = DEMOS[d](**kwargs)
        results[f"demo{d}"] = data
        if not args.json:
            print(f"=== Demo {d}: {DEMOS[d].__doc__.split(':', 1)[1].strip()}")
            print(text)
            print()
    if args.json:
        report.print_json(results)
    return 0
