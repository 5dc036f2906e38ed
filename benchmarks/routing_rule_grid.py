"""Rule grids behind issue 13's per-scenario routing agents (docs/routing-agents.md, attempts 9-10),
on training seeds only: each rule's mean TTFT on a registered scenario and its ratio to kvcentric's
(the ratio of the means over the seeds, and the mean of the per-seed ratios).

    python benchmarks/routing_rule_grid.py --grid bursty --seeds 0-12      # relsplit knobs on routing-bursty
    python benchmarks/routing_rule_grid.py --grid bursty-top --seeds 20-44  # the best ones on other seeds
    python benchmarks/routing_rule_grid.py --grid stale --seeds 0-10       # herd-aware rules on stale-multirouter

``stale`` tries two rules written here for the herd effect of ``routing-stale-multirouter`` (4
routers, each with its own scraped snapshots; ``mooncake_gym.sim.observation``), neither of which
helped (so they are not baselines): :class:`HerdInflate`, Algorithm 1 with the work this router
sent to each instance since its current snapshot counted ``1 + weight`` times (the other routers,
seeing the same stale snapshot, are assumed to have sent like it), and :class:`RandomAmongBest`,
a uniformly random pick among the ``d`` best estimates or those within ``tol`` seconds of the best
(randomising against stale information: Mitzenmacher, "How useful is old information?", IEEE TPDS
11(1), 2000).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import mooncake_gym  # noqa: F401  (registers the env ids)
from mooncake_gym.baselines.routing import KVCentric
from mooncake_gym.baselines.sizesplit import RelativeSizeSplit
from mooncake_gym.envs import ROUTING_ENV_ID
from mooncake_gym.evaluation.episodes import evaluate
from mooncake_gym.sim.routing import Route
from mooncake_gym.evaluation.scenarios import get_scenario


class HerdInflate(KVCentric):
    """Algorithm 1 where the work this router sent to an instance since its current snapshot counts
    ``1 + weight`` times (module docstring). Router ``index mod routers`` decides; its snapshots are
    taken at ``k * period + r * period / routers`` and seen ``delay`` late (the scenario's)."""

    def __init__(self, weight: float, routers: int = 4, period: float = 0.5, delay: float = 0.1):
        super().__init__()
        self.weight, self.routers, self.period, self.delay = weight, routers, period, delay
        self.sent: list = [[] for _ in range(routers)]

    def reset(self, rng) -> None:
        super().reset(rng)
        self.sent = [[] for _ in range(self.routers)]

    def __call__(self, view) -> Route:
        r = view.index % self.routers
        phase = r * self.period / self.routers
        k = math.floor((view.now - self.delay - phase) / self.period)
        snapshot_t = k * self.period + phase if k >= 0 else -math.inf
        sent = self.sent[r]
        while sent and sent[0][0] < snapshot_t:
            sent.pop(0)
        own = [0.0] * len(view.queue_s)
        for _, i, service in sent:
            own[i] += service
        costs, pulls = self.estimates(view)
        i = self._argmin([c + self.weight * o for c, o in zip(costs, own)])
        sent.append((view.now, i, view.transfer_s[i] + view.pull_prefill_s[i] if pulls[i] else view.prefill_s[i]))
        return Route(i, pulls[i])

    def __repr__(self) -> str:
        return f"HerdInflate(weight={self.weight:g})"


class RandomAmongBest(KVCentric):
    """A uniformly random instance among the ``d`` smallest Algorithm 1 estimates, or (``tol``) among
    those within ``tol`` seconds of the smallest."""

    def __init__(self, d: int = 2, tol: float | None = None):
        super().__init__()
        self.d, self.tol = d, tol

    def __call__(self, view) -> Route:
        costs, pulls = self.estimates(view)
        order = sorted(range(len(costs)), key=costs.__getitem__)
        cand = order[:self.d] if self.tol is None else [i for i in order if costs[i] <= costs[order[0]] + self.tol]
        i = cand[int(self.rng.integers(len(cand)))]
        return Route(i, pulls[i])

    def __repr__(self) -> str:
        return f"RandomAmongBest(d={self.d})" if self.tol is None else f"RandomAmongBest(tol={self.tol:g})"


#: relsplit's knobs (long_factor, long_instances, min_load) tried on routing-bursty: a grid, then
#: around its best corner.
BURSTY_KNOBS = sorted({(f, k, m) for f in (2, 3, 4) for k in (2, 3, 4) for m in (0, 1, 2, 3)}
                      | {(f, k, m) for f, k in ((1.5, 4), (1.5, 5), (2, 4), (2, 5), (2.5, 4), (3, 3)) for m in (3, 4, 6)})

GRIDS = {
    "bursty": ("routing-bursty", lambda: [RelativeSizeSplit(f, k, min_load=m) for f, k, m in BURSTY_KNOBS]),
    "bursty-top": ("routing-bursty", lambda: [RelativeSizeSplit(f, k, min_load=m) for f, k, m in
                                              ((2, 4, 3), (2, 4, 4), (2.5, 4, 3), (3, 3, 3), (3, 3, 4), (1.5, 5, 3), (3, 3, 2))]),
    "stale": ("routing-stale-multirouter", lambda: [KVCentric(1.25)] + [HerdInflate(w) for w in (-0.5, 0.5, 1, 2, 3, 6)]
              + [RandomAmongBest(2), RandomAmongBest(3), RandomAmongBest(tol=0.1), RandomAmongBest(tol=0.3)]),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", required=True, choices=sorted(GRIDS))
    ap.add_argument("--seeds", default="0-12", help="training seeds FIRST-END (END excluded; below 1,000)")
    a = ap.parse_args()
    first, _, end = a.seeds.partition("-")
    try:
        seeds = list(range(int(first), int(end)))
    except ValueError:
        ap.error(f"--seeds: expected FIRST-END, e.g. 0-12, got {a.seeds!r}")
    if not seeds or seeds[-1] >= 1000:
        ap.error(f"--seeds: expected a non-empty range of training seeds below 1,000, got {a.seeds!r}")
    scenario, rules = GRIDS[a.grid]
    kw = get_scenario(scenario).config()
    ref = None
    for rule in [KVCentric()] + rules():
        t = time.time()
        m = np.array([e["mean_ttft_s"] for e in evaluate(ROUTING_ENV_ID, rule, seeds, **kw)])
        ref = m if ref is None else ref
        print(f"{rule!r}: mean TTFT {m.mean():.4f} s, x kvcentric {m.mean() / ref.mean():.3f} "
              f"(per-seed ratios' mean {np.mean(m / ref):.3f}; {time.time() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
