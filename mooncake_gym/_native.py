"""``mypyc_attr`` for the modules that ``MOONCAKE_GYM_COMPILE=1`` compiles (setup.py): mypyc reads it
when compiling; at run time, without mypy installed, it is a decorator that changes nothing.

``@mypyc_attr(native_class=False)`` keeps a class an ordinary Python class when its module is
compiled (its methods are still compiled): classes with a ``cached_property``, frozen dataclasses,
subclasses of classes from other packages. Pure Python ignores it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # pure Python without mypy: nothing to mark

        def mypyc_attr(*attrs: str, **kwattrs: Any) -> Callable[[Any], Any]:
            return lambda x: x
