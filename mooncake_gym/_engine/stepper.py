"""The routing simulator's step-able interface on the native engine: :class:`NativeRoutingSimulator`
pauses at each arrival like :class:`~mooncake_gym.sim.routing.RoutingSimulator` (``reset``,
``view``, ``step``, ``dispatch``, ``skip``, ``last``, ``result``) while the engine holds the pool's
state and makes the view's fields; a Python policy or an environment drives it. The exact view only
(observation modes need the reference). The same numbers as the reference, view for view
(tests/test_engine_stepper.py); the environments still build the reference (``PrefillRouting-v0``
runs on this class with identical numbers when its simulator is swapped, as the test does).
This module is in the simulator's layer (tests/test_layers.py).
"""

from __future__ import annotations

from mooncake_gym._engine.routing import PoolStats, make_engine
from mooncake_gym.sim.routing import RoutingResult, RoutingSimulator, RoutingView
from mooncake_gym.sim.views import check_route

_new_tuple = tuple.__new__


def routing_view(engine, output: list, blocks: list, cache_blocks: tuple) -> RoutingView:
    """The pending request's exact ``RoutingView`` from a native ``RoutingEngine`` (``output`` and
    ``blocks``: the trace's columns as lists, ``cache_blocks``: each instance's cache size)."""
    (now, i, n_in, queue, queued, hits, prefills, best, best_instance, transfers, pulls, queued_tokens,
     ks) = engine.full_view()
    return _new_tuple(RoutingView, (now, i, n_in, output[i], blocks[i], len(cache_blocks), queue, queued, hits,
                                    prefills, best, best_instance, transfers, pulls, queued_tokens, cache_blocks, ks))


class NativeRoutingSimulator:
    """``RoutingSimulator(trace, config, cost)`` stepped on the native engine (exact view)."""

    def __init__(self, trace, config=None, cost=None, observation=None, rng=None):
        ref = RoutingSimulator(trace, config, cost, observation, rng)  # the checks, the costs, the columns
        if not ref.observation.exact:
            raise ValueError("observation: the native engine shows the exact view only; use RoutingSimulator")
        self.trace, self.config, self.cost, self.costs, self.observation = (ref.trace, ref.config, ref.cost, ref.costs,
                                                                             ref.observation)
        self._output, self._blocks = ref._output, ref._blocks
        self._cache_blocks = ref._cache_blocks
        self._n = len(self._cache_blocks)
        self._engine = make_engine(ref)
        self.reset()

    def reset(self) -> RoutingView | None:
        self._engine.reset()
        self._built = False
        self._view: RoutingView | None = None
        self._last_index = -1
        self._has_last = False
        return self.view

    @property
    def done(self) -> bool:
        return self._engine.done

    @property
    def view(self) -> RoutingView | None:
        if not self._built:
            self._view = None if self._engine.done else self._make_view()
            self._built = True
        return self._view

    exact_view = view

    def _make_view(self) -> RoutingView:
        return routing_view(self._engine, self._output, self._blocks, self._cache_blocks)

    def step(self, action) -> RoutingView | None:
        if self._engine.done:
            raise RuntimeError("step: the trace is exhausted; call reset()")
        i, pull = check_route(action, self._n)
        return self.dispatch(i, pull)

    def dispatch(self, i: int, pull: bool) -> RoutingView | None:
        self.serve(i, pull)
        return self.view

    def serve(self, i: int, pull: bool) -> None:
        self._last_index = self._engine.index
        self._engine.serve(i, pull)
        self._has_last = True
        self._built = False

    def skip(self) -> RoutingView | None:
        self.pass_over()
        return self.view

    def pass_over(self) -> None:
        if self._engine.done:
            raise RuntimeError("skip: the trace is exhausted; call reset()")
        self._engine.skip()
        self._has_last = False
        self._built = False

    @property
    def last(self) -> dict | None:
        if not self._has_last:
            return None
        _, n_in, i, ttft, queue, transfer, prefill, hit, fetched = self._engine.last_row()
        return {"index": self._last_index, "instance": i, "pull": fetched > 0, "ttft_s": ttft, "queue_s": queue,
                "transfer_s": transfer, "prefill_s": prefill, "hit_tokens": hit, "fetched_tokens": fetched,
                "input_tokens": n_in}

    def result(self, policy: str = "?") -> RoutingResult:
        stats = [PoolStats(b, r) for b, r in zip(self._engine.busy_s(), self._engine.requests())]
        return RoutingResult(policy, self.trace.name, self.config, self._engine.rows(), stats, self.cost)
