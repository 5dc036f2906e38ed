"""Figures (matplotlib, headless: an Agg canvas, no display and no change to the global backend).

- :func:`plot_load_series`: prefill and decode load over time, one panel per policy — the picture
  of Mooncake v3 Figure 9 (lecture demo 3).
- :func:`plot_hit_rate`: hit rate versus capacity (``mooncake-gym cache --plot``).
- :func:`compare_plots`: the figures of ``mooncake-gym compare --plot-dir``.
- :func:`plot_sweep`: mean and P99 TTFT, TBT attainment and token goodput against load
  (``mooncake-gym sweep --plot``).
- :func:`request_plots`: TTFT and TBT CDFs and SLO attainment and goodput per policy of one run
  (``replay --plot-dir``, ``overload --plot-dir``).

Every figure that draws one line per policy gives each its own colour and marker
(:func:`policy_styles`), so that tables of 17 policies stay readable.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np
from mooncake_gym._files import check_output_file, replacing
from mooncake_gym.evaluation import problems


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def check_plot_path(path: str | os.PathLike, name: str = "plot") -> str:
    """``path`` if a figure can be written there: a ``.png`` name whose folder exists or can be
    created and is writable (``ValueError`` naming ``name`` otherwise). Commands call it before
    their run, so a bad path fails at once, not after the work."""
    return check_output_file(path, name, (".png",))


def check_plot_dir(folder: str | os.PathLike, name: str = "plot_dir") -> str:
    """``folder``, created if missing; ``ValueError`` naming ``name`` unless it is a writable directory."""
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{name}: {folder!r} exists and is not a directory")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{name}: cannot create the directory {folder!r} ({e.strerror})") from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{name}: the directory {folder!r} is not writable")
    return folder


def _save(fig, path: str | os.PathLike) -> str:
    path = check_plot_path(path)
    with replacing(path) as tmp:  # the figure whole or not at all
        fig.savefig(tmp, format=os.path.splitext(path)[1][1:].lower() or None)
    return path


#: The lecture's load series (``admission.OverloadResult``); a result may name its own (``LOAD_LABELS``).
LOAD_LABELS = ("prefill load (share of instances busy)", "decode load (pool occupancy)")


def plot_load_series(series: Mapping[str, object], path: str | os.PathLike, title: str | None = None,
                     until_s: float | None = None) -> str:
    """Draw prefill load and decode load over time, one panel per entry of ``series``, to ``path``.

    ``series`` maps a label (e.g. a policy name) to an ``OverloadResult`` or to a triple
    ``(times_s, prefill_load, decode_load)`` of equal-length sequences. ``until_s`` cuts the time
    axis. Returns the path written.
    """
    if not series:
        raise ValueError("series: expected at least one load series to plot")
    panels: list[tuple] = []
    for label, s in series.items():
        if hasattr(s, "sample_times_s"):
            t, p, d, corr = s.sample_times_s, s.prefill_load, s.decode_load, getattr(s, "correlation", None)
        else:
            t, p, d = s
            corr = None
        t, p, d = (np.asarray(x, dtype=np.float64) for x in (t, p, d))
        if not (len(t) == len(p) == len(d)):
            raise ValueError(f"series[{label!r}]: times, prefill and decode loads differ in length")
        if until_s is not None:
            keep = t <= until_s
            t, p, d = t[keep], p[keep], d[keep]
        panels.append((str(label), t, p, d, corr, getattr(s, "LOAD_LABELS", LOAD_LABELS)))
    fig = _figure(9.0, 2.4 * len(panels) + 0.6)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (label, t, p, d, corr, (p_label, d_label)) in zip(axes, panels):
        ax.plot(t, p, color="tab:blue", lw=1.3, label=p_label)
        ax.plot(t, d, color="tab:red", lw=1.3, label=d_label)
        ax.set_ylim(-0.03, max(1.08, 1.05 * max(p.max(initial=0.0), d.max(initial=0.0))))
        ax.set_ylabel("load")
        name = label if corr is None or not np.isfinite(corr) else f"{label}  (correlation {corr:+.2f})"
        ax.set_title(name, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8, ncol=2)
    axes[-1].set_xlabel("time (s)")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _save(fig, path)



def plot_hit_rate(analysis, path: str | os.PathLike) -> str:
    """Hit rate versus cache capacity (log x axis) of a ``analysis.cache.CacheAnalysis``: one line
    per eviction policy, the infinite-cache ceiling dashed, GiB of the model's KV on the top axis."""
    from matplotlib.ticker import NullFormatter

    fig = _figure(7.0, 4.5)
    ax = fig.subplots()
    styles = {"lru": ("C0", "o"), "fifo": ("C1", "s"), "optimal": ("C2", "^")}
    caps = analysis.capacities
    for p in analysis.policies:
        color, marker = styles[p]
        ax.plot(caps, analysis.hit_rates(p), color=color, marker=marker, label=p if p != "optimal" else "optimal (Belady)")
    ax.axhline(analysis.ceiling.hit_rate, color="0.3", linestyle="--",
               label=f"infinite cache ({analysis.ceiling.hit_rate:.3f})")
    ax.set_xscale("log")
    ax.set_ylim(0.0, 1.0)
    if caps:
        ax.set_xlim(caps[0] / 1.5, caps[-1] * 1.5)
        ax.set_xticks(caps, [f"{c:,}" for c in caps])  # label the measured capacities themselves
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"cache capacity (blocks of {analysis.block_tokens} tokens)")
    window = "second half of the requests" if analysis.window == "second-half" else "all requests"
    ax.set_ylabel(f"token hit rate ({window})")
    ax.set_title(f"Prefix-cache hit rate versus capacity: {analysis.trace_name}")
    ax.grid(True, which="both", alpha=0.3)
    gib_per_block = analysis.block_tokens * analysis.kv_bytes_per_token / 2**30
    top = ax.secondary_xaxis("top", functions=(lambda b: b * gib_per_block, lambda g: g / gib_per_block))
    top.set_xticks([c * gib_per_block for c in caps], [f"{c * gib_per_block:,.4g}" for c in caps])
    top.xaxis.set_minor_formatter(NullFormatter())
    top.set_xlabel(f"GiB of {analysis.model} KV")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def compare_plots(settings, plot_dir: str | os.PathLike) -> list[str]:
    """Figures of a ``compare`` run; returns the files written.

    Per routing setting: a TTFT box plot per policy over all seeds' requests (the view of Mooncake
    v3 Figure 8) and the TTFT CDFs. Per admission setting: the load series of the first seed for
    every policy (:func:`plot_load_series`).
    """
    written = []
    for k, s in enumerate(settings):
        stem = os.path.join(os.fspath(plot_dir), f"{k + 1:02d}_{s.problem}")
        if problems.get(s.problem).plot == "load_series":
            series = {name: eps[0]["result"] for name, eps in s.episodes.items()}
            written.append(plot_load_series(series, f"{stem}_load_series.png", title=s.label))
            continue
        ttfts = {name: np.concatenate([e["result"].ttft_s for e in eps]) for name, eps in s.episodes.items()}
        fig = _figure(1.6 + 1.3 * len(ttfts), 4.4)
        ax = fig.subplots()
        ax.boxplot(list(ttfts.values()), whis=(5, 95), showfliers=False)
        ax.set_xticks(range(1, len(ttfts) + 1), list(ttfts))
        ax.set_yscale("log")
        ax.set_ylabel("TTFT (s); box quartiles, whiskers 5th-95th percentile")
        ax.set_title(s.label, fontsize=9)
        ax.grid(axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        written.append(_save(fig, f"{stem}_ttft_box.png"))
        fig = _figure(6.4, 4.4)
        ax = fig.subplots()
        styles = policy_styles(ttfts)
        for name, t in ttfts.items():
            x = np.sort(t)
            y = np.arange(1, len(x) + 1) / len(x)
            ax.plot(x, y, label=name, markevery=max(1, len(x) // 8), markersize=4, lw=1.2, **styles[name])
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(s.label, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(ttfts) > 9 else 1)
        fig.tight_layout()
        written.append(_save(fig, f"{stem}_ttft_cdf.png"))
    return written


#: Markers cycled with the colours of :func:`policy_styles`
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def policy_styles(names) -> dict:
    """``{name: {"color", "marker", "linestyle"}}``: a distinct colour (matplotlib's tab10, then the
    light halves of tab20, then tab20b) and marker for each of up to 40 policies, in the order
    given; beyond that the styles repeat with a dashed line."""
    from matplotlib import colormaps

    colours = [*colormaps["tab10"].colors, *colormaps["tab20"].colors[1::2], *colormaps["tab20b"].colors]
    return {name: {"color": colours[k % len(colours)], "marker": _MARKERS[k % len(_MARKERS)],
                   "linestyle": "-" if k < len(colours) else "--"}
            for k, name in enumerate(dict.fromkeys(names))}


#: The panels of :func:`plot_sweep`: (metric, axis label, log scale)
SWEEP_PANELS = (("mean_ttft_s", "mean TTFT (s)", True), ("p99_ttft_s", "P99 TTFT (s)", True),
                ("tbt_attainment", "share of requests with TBT <= SLO", False),
                ("token_goodput_per_s", "token goodput (good requests' output tokens / s)", False))


def plot_sweep(rows, path: str | os.PathLike, title: str = "") -> str:
    """One panel per metric of :data:`SWEEP_PANELS` against load, one line per policy
    (:func:`mooncake_gym.experiments.sweep.sweep`'s rows)."""
    fig = _figure(11, 8)
    names = list(dict.fromkeys(r["policy"] for r in rows))
    styles = policy_styles(names)
    for k, (metric, label, log) in enumerate(SWEEP_PANELS):
        ax = fig.add_subplot(2, 2, k + 1)
        for name in names:
            mine = [r for r in rows if r["policy"] == name]
            ax.plot([r["load"] for r in mine], [r[metric] for r in mine], label=name, markersize=5, **styles[name])
        ax.set_xlabel("load (x measured saturation)")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    fig.axes[0].legend(fontsize=7, ncol=2)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _cdf(ax, values: dict, label: str, styles: dict) -> None:
    for name, v in values.items():
        x = np.sort(np.asarray(v, dtype=np.float64))
        y = np.arange(1, len(x) + 1) / len(x)
        ax.plot(x, y, label=name, markevery=max(1, len(x) // 8), markersize=4, lw=1.2, **styles[name])
    ax.set_xscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("fraction of requests")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(values) > 9 else 1)


#: The bars of :func:`request_plots`: (metric keys, the first present is drawn; axis label)
RUN_BARS = ((("ttft_attainment", "slo_attainment"), "share of requests with TTFT <= SLO"),
            (("tbt_attainment",), "share of completed requests with TBT <= SLO"),
            (("good_requests",), "good requests (within the SLOs)"),
            (("token_goodput",), "token goodput (their output tokens)"))


def request_plots(rows: Mapping[str, list], metrics: Mapping[str, dict], plot_dir: str | os.PathLike,
                  title: str = "") -> list[str]:
    """The figures of ``replay --plot-dir`` and ``overload --plot-dir``: the TTFT CDF and (where the
    run has a decode pool) the TBT CDF of each policy's requests (``rows``: ``{policy: per-request
    rows}``, :func:`mooncake_gym.reporting.requests.request_rows`), and bars of SLO attainment and
    goodput per policy (``metrics``: ``{policy: metrics}``, the bars whose metric the runs have).
    Returns the files written."""
    folder = check_plot_dir(plot_dir, "--plot-dir")
    styles = policy_styles(rows)
    written = []
    for key, label, stem in (("ttft_s", "TTFT (s)", "ttft_cdf"), ("tail_tbt_s", "TBT (s): mean of the slowest "
                                                                   "10 % of a request's token intervals", "tbt_cdf")):
        values = {name: [r[key] for r in rs if r[key] is not None] for name, rs in rows.items()}
        values = {name: v for name, v in values.items() if v}
        if not values:
            continue
        fig = _figure(6.4, 4.4)
        ax = fig.subplots()
        _cdf(ax, values, label, styles)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        written.append(_save(fig, os.path.join(folder, f"{stem}.png")))
    bars = [(next(k for k in keys if k in next(iter(metrics.values()))), label) for keys, label in RUN_BARS
            if any(k in next(iter(metrics.values())) for k in keys)]
    names = list(metrics)
    fig = _figure(max(6.0, 1.2 + 0.45 * len(names)) * 2, 3.2 * ((len(bars) + 1) // 2) + 0.6)
    for k, (key, label) in enumerate(bars):
        ax = fig.add_subplot((len(bars) + 1) // 2, 2, k + 1)
        ax.bar(range(len(names)), [metrics[n][key] for n in names], color=[styles[n]["color"] for n in names])
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    written.append(_save(fig, os.path.join(folder, "slo_goodput.png")))
    return written
