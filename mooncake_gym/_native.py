"""What is left of the retired mypyc build (docs/engine.md: the native engine replaced it).

``mypyc_attr`` is the marker that the modules compiled with mypyc carried (``@mypyc_attr(...)``);
it changes nothing, and stays so that those modules import unchanged while they are edited elsewhere.
:func:`compiled` is kept for one version for callers that print it: nothing is compiled by mypyc any
more, so it is always []. ``mooncake_gym.engine()`` names the engine in use.
"""

from __future__ import annotations

from typing import Any, Callable


def mypyc_attr(*attrs: str, **kwattrs: Any) -> Callable[[Any], Any]:
    """A decorator that changes nothing (mypyc's class options, without mypyc)."""
    return lambda x: x


def compiled() -> list[str]:
    """The modules compiled by mypyc: none since the native engine replaced that build ([])."""
    return []
