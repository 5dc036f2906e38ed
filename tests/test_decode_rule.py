"""The cluster's default decode rule (decode.fastest_accepting) skips instances by a lower bound of
their step; it must choose exactly what evaluating every instance chooses, and the one-call
``load`` must give exactly the separate reads."""

import math

import numpy as np

from mooncake_gym.sim.decode import BatchingDecodeInstance, fastest_accepting
from mooncake_gym.model.presets import get_preset

COST = get_preset("mooncake").decode_cost


def _brute_force(instances, tokens, now, check):
    best, best_step = -1, math.inf
    for j, inst in enumerate(instances):
        s = inst.step_if_accepted(tokens, now, check)
        if s is not None and s < best_step:
            best, best_step = j, s
    return best


def test_the_pruned_rule_chooses_what_the_full_scan_chooses_and_load_matches_the_reads():
    rng = np.random.default_rng(0)
    capacity = 400_000  # small enough that some instances refuse
    instances = [BatchingDecodeInstance(j, COST, capacity, 0.1) for j in range(6)]
    now, r, checked = 0.0, 0, 0
    for _ in range(3000):
        now += float(rng.exponential(0.05))
        for inst in instances:  # events due by now
            while inst.next_event_s <= now:
                inst.on_event(inst.next_event_s)
        tokens = int(rng.integers(100, 60_000))
        check = bool(rng.random() < 0.7)
        j = fastest_accepting(instances, tokens, now, check)
        assert j == _brute_force(instances, tokens, now, check)
        for inst in instances:
            assert inst.load(now, tokens) == (inst.batch, inst.used_tokens(now), inst.step_s(now),
                                              inst.step_s(now, 1, tokens))
        if j >= 0:
            checked += 1
            r += 1
            instances[j].join(r, now, tokens, int(rng.integers(2, 400)), now)
    assert checked > 1000  # most requests found an instance; some did not
    assert checked < 3000
