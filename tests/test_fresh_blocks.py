"""Opt-in fresh private blocks for i.i.d. draws (workload.resample_iid, conductor.overload_workload,
``overload --preset ... --fresh-blocks``): a re-drawn request keeps the prefix the base trace shares
and gets new ids for the blocks only it had; off, every draw is as before."""

import json

import numpy as np
import pytest

from mooncake_gym.sim import cluster as conductor
from mooncake_gym.baselines import make_policy
from mooncake_gym.cli import main
from mooncake_gym.model.workload import Trace, ideal_prefix_hits, redrawn_block_ids, resample_iid, synthetic_trace

# r0: a system prompt's block 0 and its own 1; r1: r0's next turn (0, 1), then its own 2; r2: the
# system prompt, then its own 3. r0 brings 0 and 1, r1 brings 2, r2 brings 3.
BASE = Trace([0.0, 1.0, 2.0], [1024, 1536, 1000], [10, 20, 30], [(0, 1), (0, 1, 2), (0, 3)], name="tiny")


def test_redrawn_copies_reuse_what_their_request_reused_and_bring_the_rest_anew():
    draw = [1, 0, 1, 2, 0, 2]
    ids = redrawn_block_ids(BASE, draw)
    assert ids == [(0, 1, 2), (0, 1), (0, 1, 4), (0, 3), (5, 6), (0, 7)]
    drawn = BASE.take(draw, arrival_s=range(6))
    fresh = Trace(drawn.arrival_s, drawn.input_tokens, drawn.output_tokens, ids)
    assert fresh.renamed_blocks == 0  # still prefix hashes: the trace's reader keeps every id
    # an infinite cache: 0 + 2 + 2 + 1 + 0 + 1 blocks hit, against 0 + 2 + 3 + 1 + 2 + 2 when copies repeat
    assert ideal_prefix_hits(fresh)[1] == 6
    assert ideal_prefix_hits(drawn)[1] == 10


def test_the_first_request_to_bring_a_shared_block_brings_it_again():
    base = Trace([0.0, 0.0], [1024, 1024], [1, 1], [(7, 8), (7, 9)])
    assert redrawn_block_ids(base, [1, 1, 0, 0]) == [(7, 9), (7, 10), (7, 8), (11, 12)]


@pytest.mark.parametrize("seed", [0, 3])
def test_resample_iid_with_fresh_blocks_draws_the_same_requests(seed):
    base = BASE
    plain = resample_iid(base, 12, 2.0, seed)
    assert plain.block_ids == resample_iid(base, 12, 2.0, seed, fresh_blocks=False).block_ids
    fresh = resample_iid(base, 12, 2.0, seed, fresh_blocks=True)
    assert np.array_equal(fresh.arrival_s, plain.arrival_s)
    assert np.array_equal(fresh.input_tokens, plain.input_tokens)
    assert np.array_equal(fresh.output_tokens, plain.output_tokens)
    idx = [{1024: 0, 1536: 1, 1000: 2}[n] for n in plain.input_tokens.tolist()]  # lengths name the requests
    assert fresh.block_ids == redrawn_block_ids(base, idx)
    assert "fresh blocks" in fresh.name and "fresh" not in plain.name
    with pytest.raises(ValueError, match="fresh_blocks: expected True or False"):
        resample_iid(base, 12, 2.0, seed, fresh_blocks="yes")


def test_a_long_draw_tends_to_the_base_traces_hit_ratio():
    base = synthetic_trace(0, rate=4.0)
    ratio = {}
    for fresh in (False, True):
        for n in (1000, 6000):
            t = resample_iid(base, n, 10.0, 1, fresh_blocks=fresh)
            hit, _, _ = ideal_prefix_hits(t)
            ratio[fresh, n] = hit / t.input_tokens.sum()
    # without fresh blocks an infinite cache's hit ratio climbs far above the base trace's own; with
    # them a copy hits at most what its request hit in the base, so the ratio rises as the draw warms
    # up towards the base's and not past it
    base_ratio = base.stats()["ideal_hit_ratio"]  # 0.602
    assert ratio[False, 6000] > base_ratio + 0.1  # 0.732
    assert ratio[True, 1000] < ratio[True, 6000] <= base_ratio + 0.02  # 0.322, 0.572
    assert ratio[True, 6000] > base_ratio - 0.05


def test_overload_cli_fresh_blocks_is_the_conductor_workload(capsys):
    assert main(["overload", "--requests", "600", "--preset", "mooncake-overload", "--seed", "1",
                 "--policy", "early", "--fresh-blocks", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    trace, _ = conductor.overload_workload(synthetic_trace(1, rate=4.0), 2.0, 600, 1, "mooncake-overload",
                                           fresh_blocks=True)
    expected = conductor.simulate(trace, "mooncake-overload", admission=make_policy("admission", "early"), seed=1)
    assert doc["fresh_blocks"] is True
    assert doc["results"]["early"]["hit_ratio"] == pytest.approx(expected.metrics["hit_ratio"], abs=0)
    assert doc["results"]["early"]["completed"] == expected.metrics["completed"]


def test_fresh_blocks_is_refused_under_the_lecture_preset(capsys):
    assert main(["overload", "--preset", "lecture", "--fresh-blocks"]) == 2
    err = capsys.readouterr().err
    assert "--fresh-blocks: only with a cluster --preset" in err


@pytest.mark.parametrize("env_id", ["mooncake_gym/OverloadAdmission-v1", "mooncake_gym/Conductor-v1",
                                    "mooncake_gym/PrefillRouting-v1"])
def test_v1_envs_draw_fresh_blocks_when_asked(env_id):
    import gymnasium as gym

    import mooncake_gym  # noqa: F401  (registers the env ids)

    traces = {}
    for fresh in (False, True):
        env = gym.make(env_id, episode_requests=400, fresh_blocks=fresh)
        env.reset(seed=3)
        traces[fresh] = env.unwrapped.sim.trace
        env.close()
    plain, fresh = traces[False], traces[True]
    # the same draw and arrivals; only the ids of the blocks a re-drawn copy brought itself differ
    assert plain.input_tokens.tolist() == fresh.input_tokens.tolist()
    assert plain.arrival_s.tolist() == fresh.arrival_s.tolist()
    assert plain.block_ids != fresh.block_ids
    assert len({b for blocks in fresh.block_ids for b in blocks}) > len({b for blocks in plain.block_ids for b in blocks})
    with pytest.raises(ValueError, match="fresh_blocks: expected True or False"):
        gym.make(env_id, fresh_blocks="yes")
