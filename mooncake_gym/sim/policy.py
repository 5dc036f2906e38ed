"""The one policy interface shared by baselines, trained agents and users' own functions.

A policy is any callable ``policy(view) -> action``. ``view`` is the simulator's read-only
decision view (``RoutingView`` for prefill routing, ``AdmissionView`` for overload admission);
the action is what that simulator's ``step`` accepts. A policy that needs randomness or keeps
state may define ``reset(rng)``: the simulator calls it with a ``numpy.random.Generator`` seeded
from the run's seed before the first decision, so the same seed gives the same numbers.
A policy may carry a ``name`` attribute for tables; otherwise its class or function name is used.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Policy(Protocol):
    def __call__(self, view: Any) -> Any: ...


def policy_name(policy: Callable) -> str:
    name = getattr(policy, "name", None)
    if name:
        return str(name)
    return getattr(policy, "__name__", type(policy).__name__)


def reset_policy(policy: Callable, seed: int | np.random.Generator | None) -> None:
    """Call ``policy.reset(rng)`` if the policy has one (rng seeded from ``seed``)."""
    reset = getattr(policy, "reset", None)
    if callable(reset):
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        reset(rng)
