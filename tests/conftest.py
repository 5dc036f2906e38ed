"""Shared test fixtures.

Mooncake's public synthetic trace lives in ``../shared/traces/`` beside the repository (it is not
part of it); tests that need it take the ``shared_trace`` fixture and skip, with the reason, where
it is absent (a user's fresh clone).
"""

import pickle
from pathlib import Path

import pytest

import mooncake_gym
from mooncake_gym.model.workload import read_trace

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACE = REPO_ROOT.parent / "shared" / "traces" / "synthetic_trace.jsonl"


def pickle_round_trip(obj):
    """``pickle.loads(pickle.dumps(obj))``; None where the optional compiled core (``make install-fast``)
    is in use: its native classes pickle but do not unpickle (mypyc rebuilds them through their
    ``__init__``; README, "Optional compiled core"), and this asserts that documented TypeError."""
    data = pickle.dumps(obj)
    if mooncake_gym.compiled():
        with pytest.raises(TypeError, match="__init__"):
            pickle.loads(data)
        return None
    return pickle.loads(data)


@pytest.fixture(scope="session")
def shared_trace():
    if not SHARED_TRACE.is_file():
        pytest.skip(f"Mooncake's synthetic trace is not at {SHARED_TRACE} (it lives in shared/, outside the repo)")
    return read_trace(SHARED_TRACE)


@pytest.fixture
def preset_tables():
    """The tables a preset file adds to (the cost model's GPUs, interconnect and models, the presets),
    as they were before the test: a file's additions are process-wide."""
    from mooncake_gym.model import costmodel
    from mooncake_gym.model.presets import PRESETS

    tables = (costmodel.GPU_PEAK_BF16_FLOPS, costmodel.GPU_HBM_BYTES, costmodel.GPU_HBM_BANDWIDTH,
              costmodel.INTERCONNECT, costmodel.MODELS, PRESETS)
    before = [dict(t) for t in tables]
    yield tables
    for table, old in zip(tables, before):
        table.clear()
        table.update(old)
