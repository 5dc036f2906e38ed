"""The ``mooncake-gym`` command line: one module per command (``trace``, ``lecture``, ``replay``,
``overload``, ``cache``, ``train``, ``compare``, ``tune``, ``bench``), each declaring its options once
(:mod:`mooncake_gym.cli.options`) with their checks beside them, then its run; ``app`` builds the
parser, checks the arguments and dispatches (:func:`main`).
"""

from mooncake_gym.cli.app import main

__all__ = ["main"]
