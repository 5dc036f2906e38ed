"""compare --preset's bound rows: a lower bound on mean TTFT over the requests the cluster prefills
(bounds.cluster_ttft_bound) and the admission goodput bound, never beaten by any baseline."""

import re
import numpy as np
import pytest

from mooncake_gym.experiments import compare as cmp
from mooncake_gym.analysis.bounds import cluster_ttft_bound
from mooncake_gym.evaluation import problems
from mooncake_gym.experiments.preset_runs import compare_settings
from mooncake_gym.sim.cluster import simulate
from mooncake_gym.model.presets import get_preset
from mooncake_gym.model.workload import Trace

# 2 prefill instances, decode instances of 5,000 KV tokens: request 1 (6,000 + 10 tokens) never fits
# and is refused at arrival; request 2 shares request 0's first two blocks, 100 s later
HAND_PRESET = get_preset("mooncake").with_(decode_capacity_tokens=5000, n_prefill=2)
HAND_TRACE = Trace([0.0, 50.0, 100.0], [1000, 6000, 1200], [10, 10, 10],
                   [(0, 1), tuple(range(10, 22)), (0, 1, 2)])


def test_the_cluster_ttft_bound_by_hand_leaves_out_requests_refused_as_too_long():
    cost = HAND_PRESET.prefill_cost
    prefill = cost.prefill_time()
    # request 0: no hit; request 2: its fastest prefill with a hit of 0, 1 or 2 blocks (2: 0.052 s)
    w0 = prefill(1000, 0)
    w2 = min(prefill(1200, cost.hit_tokens(k, 1200)) for k in range(3))
    b = cluster_ttft_bound(HAND_TRACE, HAND_PRESET)
    assert b.min_service_s.tolist() == [w0, w2]
    assert b.mean_ttft_s == b.isolated_mean_s == (w0 + w2) / 2  # 0.1125 s; the queues are idle
    assert b.srpt_mean_s == pytest.approx((w0 + w2) / 4)  # two instances' worth of speed
    # the idle cluster attains it: request 2 goes where request 0's blocks are, and the refused
    # request has no TTFT (the cluster's mean TTFT is over the other two)
    res = simulate(HAND_TRACE, HAND_PRESET)
    assert res.metrics["refused_too_long"] == 1
    assert res.metrics["mean_ttft_s"] == pytest.approx(b.mean_ttft_s, rel=1e-12)


def test_the_cluster_ttft_bound_refuses_a_trace_with_nothing_to_prefill():
    with pytest.raises(ValueError, match="trace: no request fits in one decode instance"):
        cluster_ttft_bound(HAND_TRACE.take([1]), HAND_PRESET)


def run_with_bound(setting, seeds):
    cmp.run_setting(setting, problems.get(setting.problem).policies(), seeds)
    setting.bound = problems.get(setting.problem).bound(setting.env_id, setting.env_kwargs, seeds)
    return setting


@pytest.mark.parametrize("preset, load", [("mooncake", 0.9), ("mooncake", 1.5), ("h100", 1.2), ("mooncake-hetero", 1.2)])
def test_no_routing_baseline_beats_the_ttft_bound_on_the_cluster(preset, load):
    seeds = [11, 12, 13]
    (setting,) = compare_settings(preset, "routing", loads=(load,), episode_requests=400)
    run_with_bound(setting, seeds)
    per_seed = setting.bound["per_seed"]
    for name, episodes in setting.episodes.items():
        for e, bound in zip(episodes, per_seed):
            assert e["mean_ttft_s"] >= bound, (preset, load, name)
    assert setting.bound["mean_ttft_s"] == pytest.approx(np.mean(per_seed))
    last = cmp.format_setting(setting, markdown=True).splitlines()[-1]
    assert last.startswith("| bound | ") and last.count(" - ") == 8  # mean TTFT only


def test_no_admission_baseline_beats_the_goodput_bound_on_the_cluster():
    seeds = [11, 12, 13]
    (setting,) = compare_settings("mooncake-overload", "admission", loads=(2.0,), episode_requests=400)
    run_with_bound(setting, seeds)
    bound = setting.bound
    assert bound["policy"] == "bound"
    for row in setting.rows:
        assert row["token_goodput"] <= bound["token_goodput"], row["policy"]
        assert row["good_requests"] <= bound["good_requests"], row["policy"]
    table = cmp.format_setting(setting).splitlines()
    headers = [h.strip() for h in re.split(r"\s{2,}", table[0].strip())]
    assert "token goodput" in headers and "good requests" in headers and "goodput" not in headers
    assert table[-1].split()[0] == "bound"
