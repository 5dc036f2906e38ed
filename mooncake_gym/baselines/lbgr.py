"""``lbgr``: the learned load-balancing router of Wu, Silwal and Zhang, "Randomization Boosts KV
Caching, Learning Balances Query Load" (ICLR 2026, arXiv 2601.18999), policy ``eta_online_3d``.

Read from the authors' code (``fzwark/KVRouting``, ``sglang-0.4.6/sgl-router/src/router.rs``, enum
``EtaOnline3D``, and ``lib.rs`` for the constructor's constants; nothing copied). Per worker ``i``
the router predicts a request's latency and sends it to the smallest prediction:

* ``cached_i``: the prompt's prefix the router's **own index** says ``i`` holds (a radix tree of
  the prompts it routed to ``i``, inserted at routing and again when the request completes; a
  lookup does not refresh it). Here: one LRU index of block ids per instance
  (:class:`~mooncake_gym.sim.prefixcache.PrefixCache`, the instance's ``cache_blocks`` long;
  the code's tree holds ``max_tree_size`` = 2**24 characters per worker, trimmed every 60 s),
  ``cached_i = min(matched blocks x 512, input tokens)``.
* ``base_i = max(1 ms, token_cost_s x (input - cached_i))``: the code's ``base_ms`` with
  intercept 0, cached slope 0 and uncached slope 1000 ms per ``LEN_SCALE`` = 1000 prompt
  characters, i.e. 1 ms per uncached character; here per uncached token (``token_cost_s`` = 1e-3 by
  default, a knob).
* ``load_i``: the reserved load of ``i``. Routing a request to ``i`` adds its ``base_i``; every
  ``decay_interval_s`` = 20 ms all loads are multiplied by ``decay`` = 31/32 (the code's
  ``DECAY_NUM / DECAY_DEN`` every ``DECAY_INTERVAL_MS``; here on ticks of the simulated clock at
  multiples of 20 ms); when the request completes, what is left of its reservation,
  ``base_i x decay ** floor(elapsed / 20 ms)``, is taken off (never below 0).
* ``bias_i``: a recursive-least-squares fit of the residual ``y = max(1 ms, measured - (base_i +
  load_i at routing))`` on the constant feature 1 (the code's ``Rls4`` with only the bias learned:
  ``phi = [1, 0, 0, 0]``, ``learn_mask = [true, false, false, false]``), forgetting factor ``lam`` =
  0.992 and initial covariance ``p0`` = 1e6 (``lib.rs``): with ``k = p / (lam + p)``,
  ``bias += k (y - bias)`` and ``p = (p - k p) / lam``.
* ``pred_i = max(1 ms, base_i + 1.0 x load_i + bias_i)`` (``ALPHA_QUEUE`` = 1.0). The workers are
  scanned in order and the choice moves from the current one to worker ``i`` only when
  ``pred_i + margin_s < pred_current`` with ``margin_s`` = 1 ms (``pred + 1.0 < bp``): ties and
  near-ties keep the lower index; no randomness.

The feedback is the simulator's (``observe``, :mod:`mooncake_gym.sim.policy`): the measured TTFT of
each request this router routed, told when its prefill completes. The code measures the whole
response (its workers prefill and decode); a prefill instance's work ends with the first token, so
here the measured latency is the TTFT. Differences from the code, besides tokens for characters and
blocks for a text tree: loads and reservations are floats (the code keeps whole milliseconds and
floors each decay), and the index is trimmed by LRU at each insertion instead of every 60 s.
LBGR never pulls a prefix from another instance.
"""

from __future__ import annotations

import math

from mooncake_gym.model.costmodel import BLOCK_TOKENS
from mooncake_gym.sim.policies import _Seeded
from mooncake_gym.sim.prefixcache import PrefixCache
from mooncake_gym.sim.views import Route, RoutingView

#: The code's constants (router.rs, lib.rs), in seconds.
TOKEN_COST_S = 1e-3  # SLOPE_UNCACHED_MS / LEN_SCALE: 1 ms per uncached prompt unit
FLOOR_S = 1e-3  # base_ms(...).max(1.0), pred.max(1.0), y_resid.max(1.0)
MARGIN_S = 1e-3  # pred + 1.0 < bp
DECAY = 31 / 32  # DECAY_NUM / DECAY_DEN
DECAY_INTERVAL_S = 0.020  # DECAY_INTERVAL_MS
LOAD_WEIGHT = 1.0  # ALPHA_QUEUE
RLS_LAMBDA = 0.992  # lib.rs: EtaOnline3DConfig { lambda: 0.992, ... }
RLS_P0 = 1e6  # lib.rs: p0: 1e6


class LBGR(_Seeded):
    """``lbgr`` (module docstring): predicted latency = uncached tokens x ``token_cost_s`` + decayed
    reserved load + a per-instance bias learned online by RLS from the measured TTFTs; the smallest
    prediction wins, a later instance only when better by ``margin_s``."""

    name = "lbgr"
    #: The knobs ``tune`` searches: the per-token cost sets the scale of base and load against the
    #: learned bias and the margin; the decay sets how long a reservation counts; ``lam`` how fast
    #: the bias forgets (each grid holds the code's value).
    KNOBS = {"token_cost_s": [1e-4, 3e-4, 1e-3, 3e-3], "decay": [0.9, DECAY, 0.99, 0.995], "lam": [0.95, RLS_LAMBDA]}

    def __init__(self, token_cost_s: float = TOKEN_COST_S, decay: float = DECAY, lam: float = RLS_LAMBDA,
                 margin_s: float = MARGIN_S, decay_interval_s: float = DECAY_INTERVAL_S,
                 load_weight: float = LOAD_WEIGHT, p0: float = RLS_P0):
        super().__init__()
        for name, v, ok, what in (("token_cost_s", token_cost_s, token_cost_s > 0, "a time > 0 s per token"),
                                  ("decay", decay, 0 < decay <= 1, "a factor in (0, 1]"),
                                  ("lam", lam, 0 < lam <= 1, "a forgetting factor in (0, 1]"),
                                  ("margin_s", margin_s, margin_s >= 0, "a time >= 0 s"),
                                  ("decay_interval_s", decay_interval_s, decay_interval_s > 0, "a time > 0 s"),
                                  ("load_weight", load_weight, load_weight >= 0, "a weight >= 0"),
                                  ("p0", p0, p0 > 0, "an initial covariance > 0")):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok:
                raise ValueError(f"{name}: expected {what}, got {v!r}")
        self.token_cost_s, self.decay, self.lam, self.margin_s = float(token_cost_s), float(decay), float(lam), float(margin_s)
        self.decay_interval_s, self.load_weight, self.p0 = float(decay_interval_s), float(load_weight), float(p0)
        self._n = 0

    def reset(self, rng) -> None:
        super().reset(rng)
        self._n = 0  # the per-instance state is made at the first decision (the pool's size known then)

    def _start(self, view: RoutingView) -> None:
        n = self._n = view.n_instances
        self.index = [PrefixCache(int(c)) for c in view.cache_blocks]
        self.load_s = [0.0] * n
        self.bias_s = [0.0] * n
        self.cov = [self.p0] * n
        self._tick = 0  # the decay ticks applied so far (multiples of decay_interval_s)
        self.routed: dict[int, tuple] = {}  # request -> (instance, blocks, base, load at routing, time)

    def _decay_to(self, now_s: float) -> None:
        tick = math.floor(now_s / self.decay_interval_s)
        if tick > self._tick:
            f = self.decay ** (tick - self._tick)
            self.load_s = [x * f for x in self.load_s]
            self._tick = tick

    def predictions(self, view: RoutingView) -> tuple[list[float], list[float]]:
        """``(pred_s, base_s)`` per instance for ``view``'s request, at ``view.now`` (decays the loads)."""
        if self._n != view.n_instances:
            self._start(view)
        self._decay_to(view.now)
        n_in, ids, floor = view.input_tokens, view.block_ids, FLOOR_S
        base = [max(floor, self.token_cost_s * (n_in - min(cache.match(ids) * BLOCK_TOKENS, n_in)))
                for cache in self.index]
        pred = [max(floor, b + self.load_weight * x + r) for b, x, r in zip(base, self.load_s, self.bias_s)]
        return pred, base

    def __call__(self, view: RoutingView) -> Route:
        pred, base = self.predictions(view)
        best = 0
        for i in range(1, len(pred)):
            if pred[i] + self.margin_s < pred[best]:
                best = i
        self.routed[view.index] = (best, view.block_ids, base[best], self.load_s[best], view.now)
        self.load_s[best] += base[best]
        self.index[best].insert(view.block_ids)
        return Route(best)

    def observe(self, request_index: int, instance: int, measured_ttft_s: float, now_s: float) -> None:
        """The feedback (:mod:`mooncake_gym.sim.policy`): request ``request_index``, routed here to
        ``instance``, completed its prefill at ``now_s`` with TTFT ``measured_ttft_s``. Updates the
        instance's bias (RLS), takes what is left of its reservation off the load, and refreshes its
        prompt in the index. A request this router did not route is ignored."""
        rec = self.routed.pop(request_index, None) if self._n else None
        if rec is None:
            return
        i, ids, base, load_at_route, routed_at = rec
        self._decay_to(now_s)
        y = max(FLOOR_S, measured_ttft_s - (base + self.load_weight * load_at_route))
        p = self.cov[i]
        k = p / (self.lam + p)
        self.bias_s[i] += k * (y - self.bias_s[i])
        self.cov[i] = (p - k * p) / self.lam
        left = base * self.decay ** math.floor((now_s - routed_at) / self.decay_interval_s)
        self.load_s[i] = max(0.0, self.load_s[i] - left)
        self.index[i].insert(ids)

    def __repr__(self) -> str:
        return (f"LBGR(token_cost_s={self.token_cost_s:g}, decay={self.decay:g}, lam={self.lam:g}, "
                f"margin_s={self.margin_s:g})")
