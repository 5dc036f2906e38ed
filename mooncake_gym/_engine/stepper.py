"""The routing simulator's step-able interface on the native engine: :class:`NativeRoutingSimulator`
pauses at each arrival like :class:`~mooncake_gym.sim.routing.RoutingSimulator` (``reset``,
``view``, ``step``, ``dispatch``, ``skip``, ``last``, ``result``, ``snapshot``, ``restore``) while
the engine holds the pool's state and makes the view's fields; a Python policy or an environment
drives it (``PrefillRouting-v0`` runs on it). The exact view only (observation modes need the
reference). The same numbers as the reference, view for view (tests/test_engine_routing.py).
It pickles as its trace, pool and the dispatches made so far, replayed when it is unpickled.
This module is in the simulator's layer (tests/test_layers.py).
"""

from __future__ import annotations

from mooncake_gym._engine import native
from mooncake_gym._engine.routing import (PoolStats, make_engine, policy_spec, policy_unsupported, rng_state, set_policy_state,
                                          set_rng_state, store_unsupported)
from mooncake_gym.sim.observation import as_observation
from mooncake_gym.sim.routing import RoutingResult, RoutingSimulator, RoutingView
from mooncake_gym.sim.views import Route, check_route

_new_tuple = tuple.__new__
_EXACT = as_observation(None)  # the engine's observation (frozen: one shared)


class RoutingSnapshot:
    """An opaque copy of a simulator's state (:meth:`NativeRoutingSimulator.snapshot`)."""

    __slots__ = ("engine",)

    def __init__(self, engine):
        self.engine = engine


def routing_view(engine, output: list, blocks: list, cache_blocks: tuple) -> RoutingView:
    """The pending request's exact ``RoutingView`` from a native ``RoutingEngine`` (``output`` and
    ``blocks``: the trace's columns as lists, ``cache_blocks``: each instance's cache size)."""
    (now, i, n_in, queue, queued, hits, prefills, best, best_instance, transfers, pulls, queued_tokens,
     ks) = engine.full_view()
    return _new_tuple(RoutingView, (now, i, n_in, output[i], blocks[i], len(cache_blocks), queue, queued, hits,
                                    prefills, best, best_instance, transfers, pulls, queued_tokens, cache_blocks, ks, None))


class NativeRoutingSimulator:
    """``RoutingSimulator(trace, config, cost)`` stepped on the native engine (exact view)."""

    def __init__(self, trace, config=None, cost=None, observation=None, rng=None, costs=None):
        """``costs``: the instances' cost models of ``config`` and ``cost`` where the caller has
        checked the pool and the trace already (an environment's episodes): no reference
        simulator is then built for the checks."""
        if costs is None:
            ref = RoutingSimulator(trace, config, cost, observation, rng)  # the checks, the costs
            if not ref.observation.exact:
                raise ValueError("observation: the native engine shows the exact view only; use RoutingSimulator")
            trace, config, cost, costs = ref.trace, ref.config, ref.cost, ref.costs
        why = store_unsupported(config)
        if why:
            raise ValueError(f"config: {why}; use RoutingSimulator")
        self.trace, self.config, self.cost, self.costs = trace, config, cost, tuple(costs)
        self.observation = _EXACT
        self._cache_blocks = config.instance_cache_blocks()
        self._n = len(self._cache_blocks)
        self._output = None  # the trace's output lengths and block ids as lists, made for the first view
        self._engine = make_engine(self)  # (a new engine is at its start: no reset)
        self._built_at = -1
        self._view: RoutingView | None = None

    # -- snapshots and pickling ----------------------------------------------------------------------
    def snapshot(self) -> "RoutingSnapshot":
        """A copy of the whole simulation state (the engine's pool, caches, rows and pending view),
        for :meth:`restore`; the trace and the pool's set-up are shared, not copied."""
        return RoutingSnapshot(self._engine.snapshot())

    def restore(self, snapshot: "RoutingSnapshot") -> RoutingView | None:
        """Back to the state of ``snapshot`` (taken from this simulator; it stays valid for more
        restores); returns the pending view."""
        if not isinstance(snapshot, RoutingSnapshot):
            raise ValueError(f"snapshot: expected a RoutingSnapshot of this simulator, got {type(snapshot).__name__}")
        self._engine.restore(snapshot.engine)
        self._built_at = -1
        return self.view

    def pool_state(self, now: float) -> tuple[list[float], list[int]]:
        """Each instance's queued work at ``now`` and the blocks its cache holds (the pictures)."""
        return self._engine.pool_state(now)

    def __getstate__(self) -> dict:
        rows = self._engine.rows()
        if self._engine.index != len(rows):
            raise TypeError("NativeRoutingSimulator: a run with skipped requests does not pickle (it is replayed "
                            "from its dispatches)")
        return {"trace": self.trace, "config": self.config, "cost": self.cost, "index": self._engine.index,
                "dispatched": [(int(i), bool(f > 0)) for i, f in zip(rows[:, 2], rows[:, 8])]}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["trace"], state["config"], state["cost"])
        for i, pull in state["dispatched"]:  # a pull with nothing to fetch acts as the plain dispatch
            self._engine.serve(i, pull)
        self._built_at = -1

    def reset(self) -> RoutingView | None:
        self._restart()
        return self.view

    def _restart(self) -> None:
        self._engine.reset()
        self._built_at = -1  # the request the view was made for (the engine may be stepped by an env core)
        self._view: RoutingView | None = None

    @property
    def done(self) -> bool:
        return self._engine.done

    @property
    def view(self) -> RoutingView | None:
        k = self._engine.index
        if self._built_at != k:
            self._view = None if self._engine.done else self._make_view()
            self._built_at = k
        return self._view

    exact_view = view

    def _make_view(self) -> RoutingView:
        if self._output is None:
            self._output = self.trace.output_tokens.tolist()
            self._blocks = self.trace.block_ids
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
        self._engine.serve(i, pull)

    def decide(self, spec, rng) -> tuple[int, bool]:
        """The native policy ``spec``'s answer (instance, pull) on the pending view, drawing its ties
        from ``rng`` (an engine ``Pcg64``); the policy's running state goes on in ``spec``."""
        return self._engine.decide(spec, rng)

    def last_ttft_s(self) -> float:
        """The last dispatched request's TTFT (``last["ttft_s"]`` without making the dict)."""
        return self._engine.last_row()[3]

    def skip(self) -> RoutingView | None:
        self.pass_over()
        return self.view

    def pass_over(self) -> None:
        if self._engine.done:
            raise RuntimeError("skip: the trace is exhausted; call reset()")
        self._engine.skip()

    @property
    def last(self) -> dict | None:
        index = self._engine.last_index
        if index < 0:
            return None
        _, n_in, i, ttft, queue, transfer, prefill, hit, fetched = self._engine.last_row()
        return {"index": index, "instance": i, "pull": fetched > 0, "ttft_s": ttft, "queue_s": queue,
                "transfer_s": transfer, "prefill_s": prefill, "hit_tokens": hit, "fetched_tokens": fetched,
                "input_tokens": n_in}

    def result(self, policy: str = "?") -> RoutingResult:
        stats = [PoolStats(b, r) for b, r in zip(self._engine.busy_s(), self._engine.requests())]
        return RoutingResult(policy, self.trace.name, self.config, self._engine.rows(), stats, self.cost)


class NativeDecider:
    """A native ``policy``'s decisions made by the engine of a stepped routing simulator
    (:class:`NativeRoutingSimulator`, e.g. a ``PrefillRouting-v0``
    episode on the engine): ``decider()`` is the ``Route`` that ``policy(sim.view)`` would answer,
    without building the view in Python. The policy's ties are drawn from an engine copy of its
    generator; :meth:`close` writes the generator (and relsplit's running scale) back into the
    policy, so that it ends where answering the views in Python would leave it (a production
    router's window of recent requests is not written back, as with :func:`run`: its ``reset``
    clears it)."""

    def __init__(self, sim, policy):
        self.sim, self.policy = sim, policy
        self.spec = policy_spec(policy)
        self.rng = native.Pcg64(rng_state(policy.rng))

    @classmethod
    def of(cls, sim, policy) -> "NativeDecider | None":
        """A decider for ``policy`` on ``sim``, or None where the engine cannot make its decisions
        (``sim`` on the reference, or :func:`policy_unsupported`)."""
        if not isinstance(sim, NativeRoutingSimulator) or policy_unsupported(policy, len(sim.costs)):
            return None
        return cls(sim, policy)

    def __call__(self):
        return Route(*self.sim.decide(self.spec, self.rng))

    def close(self) -> None:
        set_rng_state(self.policy.rng, self.rng.state())
        set_policy_state(self.policy, self.spec)
