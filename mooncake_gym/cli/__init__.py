"""The ``mooncake-gym`` command line.
"""

from mooncake_gym.cli.app import main

__all__ = ["main"]
