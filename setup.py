"""Opt-in compilation of the simulator's inner loops with mypyc.

``pip install -e .`` (the default, ``make install``) installs the pure-Python package: this file
then only calls ``setup()`` and the metadata is pyproject.toml's. With ``MOONCAKE_GYM_COMPILE=1``
(``make install-fast``) the modules of :data:`COMPILED` are compiled with mypyc into C extensions
placed next to their .py files, which they shadow: a compiled module runs its .py as it was when
compiled (``make clean-compiled`` removes the extensions; ``mooncake_gym.compiled()`` lists the compiled
modules in use, and importing ``mooncake_gym`` warns when a .py is newer than its extension).
"""

import os

from setuptools import setup

#: mypy's options for the build.
MYPY_OPTIONS = [
    "--follow-imports=silent",  # type errors of the compiled modules only
    "--ignore-missing-imports",  # mooncake_gym.baselines (its folder is baselines/, which mypy does not map)
]
#: The modules compiled with ``MOONCAKE_GYM_COMPILE=1`` (one group: calls between them are native).
COMPILED = [
    "mooncake_gym/sim/prefixcache.py",
    "mooncake_gym/sim/prefill.py",
    "mooncake_gym/sim/decode.py",
    "mooncake_gym/sim/routing.py",
    "mooncake_gym/sim/cluster.py",
]

if os.environ.get("MOONCAKE_GYM_COMPILE") == "1":
    from mypyc.build import mypycify  # mypy: installed by `make install-fast`

    # one shared library for the group, inside the package: mooncake_gym/_compiled__mypyc.*.so
    # its generated C in build/mypyc (make clean-compiled removes that folder only: build/ holds other runs)
    setup(ext_modules=mypycify(MYPY_OPTIONS + COMPILED, opt_level="3", group_name="mooncake_gym._compiled", target_dir="build/mypyc"))
else:
    setup()
