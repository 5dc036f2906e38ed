"""The one policy interface shared by baselines, trained agents and users' own functions.

A policy is any callable ``policy(view) -> action``. ``view`` is the simulator's read-only
decision view (``RoutingView`` for prefill routing, ``AdmissionView`` for overload admission);
the action is what that simulator's ``step`` accepts. A policy that needs randomness or keeps
state may define ``reset(rng)``: the simulator calls it with a ``numpy.random.Generator`` seeded
from the run's seed before the first decision, so the same seed gives the same numbers.
A policy may carry a ``name`` attribute for tables; otherwise its class or function name is used.

Feedback: a routing policy that learns from what it measured may define
``observe(request_index, instance, measured_ttft_s, now_s)``. The simulators call it for every
request the policy routed, once, when that request's prefill completes: ``now_s`` is the
completion time, ``measured_ttft_s`` the request's real TTFT (completion - arrival), ``instance``
the prefill instance that served it. It is called before the first decision at or after ``now_s``
and never earlier, so a policy learns nothing of a request before it would in a deployment.
:func:`mooncake_gym.sim.routing.simulate` and :func:`mooncake_gym.sim.cluster.simulate` connect the
policies they are given; on a simulator you step yourself, call ``sim.listen(policy)`` once
(``RoutingSimulator``, ``ClusterSimulator``; an environment makes a new one at each ``reset``:
``env.unwrapped.sim.listen(policy)`` after it, as ``evaluation.episodes.ViewPolicy`` does).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
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


def feedback_of(policy: Callable) -> Callable | None:
    """The policy's ``observe`` method (the feedback channel, module docstring), or None."""
    observe = getattr(policy, "observe", None)
    return observe if callable(observe) else None


def is_policy_spec(name: str) -> bool:
    """Whether ``name`` names a user's policy (``module:attribute`` or ``path.py:attribute``)
    rather than a baseline."""
    return isinstance(name, str) and ":" in name


def load_policy(spec: str) -> Callable:
    """A user's policy from ``spec``: ``path/to/file.py:name`` (the file is imported from its path)
    or ``package.module:name`` (imported from ``sys.path``). ``name`` is a function ``(view) ->
    action`` or a class, instantiated with no arguments. Importing the file RUNS its code: for your
    own files (a student's submission is graded in a child process instead: ``lab grade``).
    ``ValueError`` naming ``spec`` for a missing file, a module that fails to import, a missing
    attribute or one that is not callable."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise ValueError(f"policy: expected MODULE:NAME or FILE.py:NAME with NAME a Python name, got {spec!r}")
    try:
        if where.endswith(".py"):
            if not os.path.isfile(where):
                raise ValueError(f"policy {spec}: no file {where!r}")
            module_name = f"mooncake_gym_user_policy_{abs(hash(os.path.abspath(where)))}"
            module = sys.modules.get(module_name)
            if module is None:
                file_spec = importlib.util.spec_from_file_location(module_name, where)
                if file_spec is None or file_spec.loader is None:
                    raise ValueError(f"policy {spec}: cannot import {where!r}")
                module = importlib.util.module_from_spec(file_spec)
                file_spec.loader.exec_module(module)
                sys.modules[module_name] = module
        else:
            module = importlib.import_module(where)
    except ValueError:
        raise
    except Exception as e:  # the user's module failed at import: one line naming it, no traceback
        raise ValueError(f"policy {spec}: importing {where} failed: {type(e).__name__}: {e}".splitlines()[0]) from None
    policy = getattr(module, attr, None)
    if policy is None:
        raise ValueError(f"policy {spec}: {where} has no {attr!r}")
    if isinstance(policy, type):
        try:
            policy = policy()
        except Exception as e:
            raise ValueError(f"policy {spec}: {attr}() failed: {type(e).__name__}: {e}".splitlines()[0]) from None
    if not callable(policy):
        raise ValueError(f"policy {spec}: {attr} is not callable (expected a function view -> action)")
    return UserPolicy(spec, policy)


class UserPolicy:
    """A user's policy as :func:`load_policy` returns it: calls go to ``policy``, and an exception
    it raises (in a decision or in ``reset``) becomes a ``ValueError`` naming ``spec``, so a command
    ends with one line instead of a traceback. Other attributes are the policy's own."""

    def __init__(self, spec: str, policy: Callable):
        self.spec, self.policy = spec, policy
        self.name = policy_name(policy)

    def _failed(self, what: str, e: Exception) -> ValueError:
        return ValueError(f"policy {self.spec}: {what} raised {type(e).__name__}: {e}".splitlines()[0])

    def __call__(self, view):
        try:
            return self.policy(view)
        except Exception as e:  # the user's code failed: one line naming it
            raise self._failed("the policy", e) from None

    def reset(self, rng) -> None:
        try:
            reset_policy(self.policy, rng)
        except Exception as e:
            raise self._failed("reset", e) from None

    def __getattr__(self, name):
        return getattr(self.__dict__["policy"], name)
