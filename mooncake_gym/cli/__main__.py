"""``python -m mooncake_gym.cli``: the ``mooncake-gym`` command."""

import sys

from mooncake_gym.cli import main

sys.exit(main())
