"""Shared test fixtures.

Mooncake's public synthetic trace lives in ``../shared/traces/`` beside the repository (it is not
part of it); tests that need it take the ``shared_trace`` fixture and skip, with the reason, where
it is absent (a user's fresh clone).
"""

from pathlib import Path

import pytest

import mooncake_gym
from mooncake_gym.workload import read_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACE = REPO_ROOT.parent / "shared" / "traces" / "synthetic_trace.jsonl"

#: Marks a test that pickles a simulator mid-episode: the optional compiled core (``make install-fast``)
#: cannot (README, "Optional compiled core"), so there it is skipped with that reason; the default
#: pure-Python install runs it.
pickles_simulator = pytest.mark.skipif(
    bool(mooncake_gym.compiled()),
    reason=f"compiled core in use ({', '.join(mooncake_gym.compiled())}): its simulators do not pickle mid-episode")


@pytest.fixture(scope="session")
def shared_trace():
    if not SHARED_TRACE.is_file():
        pytest.skip(f"Mooncake's synthetic trace is not at {SHARED_TRACE} (it lives in shared/, outside the repo)")
    return read_trace(SHARED_TRACE)
