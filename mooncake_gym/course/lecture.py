"""The course lecture's three demos (``shared/spec/lecture.md``), reproduced with our simulators.

Each demo function returns ``(data, text)``: a JSON-ready dict and the printed report.
"""

from __future__ import annotations

import math
import os

import numpy as np

from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.reporting import tables as report

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
    from mooncake_gym.baselines import run_baselines
    from mooncake_gym.sim.routing import RoutingConfig
    from mooncake_gym.model.workload import synthetic_trace

    config = RoutingConfig()
    data, text = {"config": {"n_instances": config.n_instances, "cache_blocks": config.cache_blocks,
                             "ttft_slo_s": config.ttft_slo_s}, "rates": []}, []
    for rate in DEMO2_RATES:
        trace = synthetic_trace(0, rate)
        results = run_baselines("routing", trace, config=config, seed=0)
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


DEMO3_SERIES_S = 60.0  # the first 60 s of the load series are printed


def demo3(plot: str | None = None, seed: int = 0):
    """Demo 3: early rejection under overload — Mooncake §7, Table 3 and Figure 9.

    With ``plot`` also writes the load series of baseline and early (the picture of Figure 9).
    """
    from mooncake_gym.baselines import run_baselines
    from mooncake_gym.sim.admission import DEMO3_BASE_RATE, DEMO3_LOAD, DEMO3_REQUESTS, OverloadConfig, overload_workload
    from mooncake_gym.model.workload import synthetic_trace

    config = OverloadConfig()
    cost = CostModel()
    base = synthetic_trace(seed, rate=DEMO3_BASE_RATE)
    occ = float(np.mean([(i + o) * cost.decode_s(o, config.tbt_s)
                         for i, o in zip(base.input_tokens.tolist(), base.output_tokens.tolist())]))
    trace, sat = overload_workload(base, DEMO3_LOAD, DEMO3_REQUESTS, seed, config.preset(cost), pool="decode")
    capacity = sat.decode_per_s
    results = run_baselines("admission", trace, None, config, cost, seed)
    m = {name: r.metrics for name, r in results.items()}
    b, e, p, pd = m["baseline"], m["early"], m["predict"], m["predict_dist"]
    series = {name: results[name].series(DEMO3_SERIES_S) for name in ("baseline", "early")}
    data = {
        "config": vars(config), "base_trace": base.name, "trace": trace.name, "requests": len(trace),
        "mean_occupancy_token_s": occ, "decode_capacity_per_s": capacity, "load": DEMO3_LOAD,
        "arrival_rate_per_s": DEMO3_LOAD * capacity, "results": m, "series": series,
    }
    text = [
        f"{config.n_prefill} prefill + {config.n_decode} decode instances; a decode instance holds "
        f"{config.decode_capacity_tokens:,} tokens, a request occupies input + output tokens for output x "
        f"{config.tbt_s:g} s. Base trace {base.name}: occ = mean((input + output) x output x {config.tbt_s:g}) = "
        f"{occ:,.0f} token-s, so the decode pool completes {config.n_decode} x "
        f"{config.decode_capacity_tokens:,} / occ = {capacity:.2f} requests/s.",
        f"{len(trace):,} requests drawn i.i.d. from it, stationary Poisson arrivals at {DEMO3_LOAD:g}x = "
        f"{DEMO3_LOAD * capacity:.2f}/s ({trace.duration_s:.0f} s); TTFT SLO {config.ttft_slo_s:g} s; loads sampled "
        f"every {config.sample_period_s:g} s (P = share of prefill instances busy, D = decode pool occupancy); "
        f"correlation and steady-state rate from t = {config.warmup_s:g} s on.",
        "",
        report.format_table([report.overload_row(x) for x in m.values()], report.OVERLOAD_COLUMNS),
        "",
        f"First {DEMO3_SERIES_S:g} s of the load series:",
        report.format_table(
            [{"time_s": rb["time_s"], "bp": rb["prefill_load"], "bd": rb["decode_load"],
              "ep": re_["prefill_load"], "ed": re_["decode_load"]}
             for rb, re_ in zip(series["baseline"], series["early"])],
            [("time_s", "t s", ".0f"), ("bp", "baseline P", ".2f"), ("bd", "baseline D", ".2f"),
             ("ep", "early P", ".2f"), ("ed", "early D", ".2f")]),
        "",
    ]

    def change(x, y):
        return y / x - 1 if x else float("nan")

    corr_b = b["load_correlation"]
    corr_b_text = (f"{corr_b:+.2f}" if math.isfinite(corr_b)
                   else "undefined: its prefill never idles, P stays at 1.00")
    text += [
        f"- baseline: the decode pool stays {b['mean_decode_occupancy']:.0%} full and prefill keeps accepting "
        f"(P averages {b['mean_prefill_load']:.0%}); only after prefill does it find no room: "
        f"{b['rejected_after_prefill']:,} of the {b['admitted']:,} requests it admits "
        f"({b['wasted_share_of_admitted']:.0%}) waste {b['wasted_prefill_s']:,.0f} s of prefill.",
        f"- early: wasted prefill {change(b['wasted_prefill_s'], e['wasted_prefill_s']):+.0%}, completed "
        f"{change(b['completed'], e['completed']):+.1%} ({e['completed']:,} vs {b['completed']:,}): the decode pool "
        f"decides completions. Per second in the steady state early completes {e['steady_completed_per_s']:.2f} vs "
        f"{b['steady_completed_per_s']:.2f}; the gap in the total is baseline's {config.ttft_slo_s:g}-s prefill "
        f"backlog, which still completes {b['completed_after_last_arrival']} requests after the last arrival "
        f"(early: {e['completed_after_last_arrival']}).",
        f"- anti-phase: early's prefill/decode load correlation is {e['load_correlation']:+.2f} (baseline: "
        f"{corr_b_text}): decode full -> reject everything, prefill idles; decode frees up -> a burst is "
        "accepted, which floods decode after prefill (Mooncake Figures 9 and 10a).",
        f"- predict (every request decodes the mean {cost.decode_s(float(np.mean(trace.output_tokens)), config.tbt_s):.1f} s): "
        f"wasted prefill {change(b['wasted_prefill_s'], p['wasted_prefill_s']):+.0%}, completed "
        f"{change(b['completed'], p['completed']):+.1%}: on this long-tailed output distribution a request that "
        "has decoded longer than t_d is counted as gone although it often runs much longer.",
        f"- predict_dist (decode-time distribution, conditioned on how long each request has run): wasted prefill "
        f"{change(b['wasted_prefill_s'], pd['wasted_prefill_s']):+.0%}, completed "
        f"{change(b['completed'], pd['completed']):+.1%} in total, "
        f"{change(b['steady_completed_per_s'], pd['steady_completed_per_s']):+.1%} per second in the steady state. "
        + ("It completes more than baseline with less waste." if pd["completed"] > b["completed"]
           and pd["wasted_prefill_s"] < b["wasted_prefill_s"] else
           "It does not complete more than baseline in total (the open problem stays open here), "
           "only per second in the steady state."),
    ]
    if plot:
        from mooncake_gym.reporting.plots import plot_load_series

        plot_load_series({"baseline": results["baseline"], "early": results["early"]}, plot,
                         title=f"Prefill and decode load under {DEMO3_LOAD:g}x overload "
                               f"({len(trace):,} requests, seed {seed})")
        data["plot"] = os.fspath(plot)
        text += ["", f"load series of baseline and early written to {plot}"]
    return data, "\n".join(text)


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
            print(f"=== Demo {d}: {DEMOS[d].__doc__.splitlines()[0].split(':', 1)[1].strip()}")
            print(text)
            print()
    if args.json:
        report.print_json(results)
    return 0
