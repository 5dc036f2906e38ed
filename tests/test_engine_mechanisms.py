"""The engines' mechanisms of the realistic presets, by hand: chunked prefill batching per iteration
(``prefill.PrefillEngine``) and preemption by recompute or swap (``decode.BatchingDecodeInstance``).

Every expected time is built from the cost model's own terms (one chunk's FLOPs time, one
iteration's time, one decode step), following the schedule worked out in each test's comments."""

import math

import numpy as np
import pytest

from mooncake_gym.model.costmodel import CostModel
from mooncake_gym.model.presets import PRESETS, PrefillBatching, RoutingConfig, get_preset
from mooncake_gym.model.workload import Trace
from mooncake_gym.sim.cluster import COMPLETED, PREEMPTED, ClusterSimulator, simulate
from mooncake_gym.sim.decode import tail_means
from mooncake_gym.sim.prefill import PrefillEngine, PrefillInstance
from mooncake_gym.sim.routing import Route, RoutingSimulator
from test_conductor import trace_of  # (arrival_s, input_tokens, output_tokens) tuples; distinct blocks

COST = CostModel.realistic()
PT = COST.prefill_time()
OVH = COST.instance.prefill_overhead_s  # per request, spent in the iteration of its last chunk
ONE = get_preset("mooncake").with_(n_prefill=1, n_decode=1)


def c(p, e):
    """Linear layers' FLOPs time of tokens p..e of one prompt."""
    return PT.chunk_compute_s(p, e)


def a(p, e):
    """Attention time of tokens p..e of one prompt over its e keys (max of FLOPs and KV read)."""
    return PT.chunk_attention_s(p, e)


# --- chunked prefill batching ----------------------------------------------------------------------
def test_the_realistic_presets_batch_prefill_and_recompute_and_the_lecture_does_neither():
    for name in ("mooncake", "mooncake-overload", "mooncake-hetero", "h100"):
        assert PRESETS[name].prefill_token_budget == 8192 and PRESETS[name].preemption == "recompute"
        assert PRESETS[name].shared_nics and PRESETS[name].pipeline_nodes == 1  # the pipeline: opt-in
    assert PRESETS["lecture"].prefill_token_budget == 0 and PRESETS["lecture"].preemption == "abort"
    with pytest.raises(ValueError, match="prefill_token_budget"):
        PRESETS["lecture"].with_(prefill_token_budget=8192)  # the toy's cost model has no iterations
    with pytest.raises(ValueError, match="token_budget"):
        PrefillBatching(-1)
    with pytest.raises(ValueError, match="preemption"):
        ONE.with_(preemption="drop")


def test_a_lone_prompt_takes_its_prefill_time_whatever_the_chunks():
    for n in (1000, 8192, 20_000):
        res = simulate(trace_of((0.0, n, 5)), ONE, kv_transfer=False)
        assert res.ttft_s[0] == pytest.approx(COST.prefill_s(n, 0), rel=1e-12)


def test_queued_prompts_share_iterations_up_to_the_token_budget():
    # A (10,000 tokens), B (3,000), C (2,000) at 0; D (1,000) during iteration 1; E (500) during iteration 2.
    # iteration 1, from 0: A's first 8,192 tokens (the budget);
    d1 = PT.iteration_s(c(0, 8192), 8192, a(0, 8192))
    # iteration 2: A's last 1,808, then B, C and D whole (6,808 + 1,000 = 7,808 <= 8,192); it ends all four
    d2 = PT.iteration_s(c(8192, 10_000) + c(0, 3000) + c(0, 2000) + c(0, 1000), 7808,
                        a(8192, 10_000) + a(0, 3000) + a(0, 2000) + a(0, 1000)) + 4 * OVH
    # iteration 3: E alone, formed when it starts (E arrived during iteration 2)
    d3 = PT.iteration_s(c(0, 500), 500, a(0, 500)) + OVH
    t_d, t_e = d1 / 2, d1 + d2 / 2
    tr = trace_of((0.0, 10_000, 5), (0.0, 3000, 5), (0.0, 2000, 5), (t_d, 1000, 5), (t_e, 500, 5))
    sim = RoutingSimulator(tr, RoutingConfig(1, 0, 30.0), COST, batching=PrefillBatching(8192))
    views = []
    view = sim.view
    while view is not None:
        views.append(view)
        view = sim.step(Route(0))
    # at D's arrival the view's queue is an estimate: iteration 1's end + each queued prompt's time alone
    est = d1 + (PT._chunked_compute(10_000, 8192) + OVH) + COST.prefill_s(3000) + COST.prefill_s(2000) - t_d
    assert views[3].queue_s[0] == pytest.approx(est, rel=1e-12)
    assert views[3].queued_requests[0] == 3
    res = sim.result()
    end2 = d1 + d2
    assert res.ttft_s.tolist() == pytest.approx([end2, end2, end2, end2 - t_d, end2 + d3 - t_e], rel=1e-12)
    assert sim.instances[0].engine.iterations == 3
    assert sim.instances[0].busy_s == pytest.approx(d1 + d2 + d3, rel=1e-12)
    # the same requests one at a time (FIFO, no budget) end one after another
    serial = RoutingSimulator(tr, RoutingConfig(1, 0, 30.0), COST)
    view = serial.view
    while view is not None:
        view = serial.step(Route(0))
    assert serial.result().ttft_s[1] == pytest.approx(COST.prefill_s(10_000) + COST.prefill_s(3000), rel=1e-12)


def test_a_prompt_waiting_for_its_pull_is_passed_over():
    inst = PrefillInstance(0, 0)
    engine = inst.engine = PrefillEngine(8192, PT, inst)
    engine.add(0, 0.0, 0.5, 4000, 0, COST.prefill_s(4000))  # its prefix arrives at 0.5 s
    engine.add(1, 0.0, 0.0, 1000, 0, COST.prefill_s(1000))
    engine.advance(math.inf)
    d1 = PT.iteration_s(c(0, 1000), 1000, a(0, 1000)) + OVH  # iteration 1, from 0: request 1 alone
    assert d1 < 0.5
    d2 = PT.iteration_s(c(0, 4000), 4000, a(0, 4000)) + OVH  # iteration 2 waits for request 0's pull: from 0.5 s
    assert engine.ended == [(1, pytest.approx(d1, rel=1e-12)), (0, pytest.approx(0.5 + d2, rel=1e-12))]
    assert inst.busy_until == pytest.approx(0.5 + d2, rel=1e-12) and engine.waiting == 0


def test_the_cluster_takes_the_batched_ttfts_and_conserves_requests():
    tr = trace_of(*[(0.1 * k, 500 + 700 * (k % 5), 20) for k in range(40)])
    p = get_preset("mooncake").with_(n_prefill=2, n_decode=2)
    res = simulate(tr, p)
    routed = RoutingSimulator(tr, p.routing_config(), p.prefill_cost, batching=p.prefill_batching())
    view = routed.view
    while view is not None:
        view = routed.step(res.prefill_instance[view.index].item())
    assert res.ttft_s.tolist() == routed.result().ttft_s.tolist()
    assert (res.outcome == COMPLETED).all() and res.metrics["completed"] == 40


# --- preemption: re-queued, recomputed or swapped -----------------------------------------------------
def _step(b, k):
    return COST.decode_step_s(b, k)


def _two_requests(mode):
    # two prompts of 1,000 tokens and 200 output tokens (199 decode iterations each) on one decode
    # instance of 2,100 tokens: both prefilled in one iteration, both join at T with 2,000 tokens;
    # the iteration from boundary k needs 2,000 + 2 (k + 1) tokens: at boundary 50 it does not fit,
    # and the later request (B) is preempted with 1,000 + 50 tokens; A decodes its 149 iterations alone
    small = ONE.with_(decode_capacity_tokens=2100, preemption=mode)
    res = simulate(trace_of((0.0, 1000, 200), (0.0, 1000, 200)), small, decode_check="kv", kv_transfer=False)
    T = PT.iteration_s(2 * c(0, 1000), 2000, 2 * a(0, 1000)) + 2 * OVH
    both = [_step(2, 2000 + 2 * k) for k in range(50)]
    alone = [_step(1, 1050 + m) for m in range(149)]  # A's last 149 iterations, and B's after it
    return res, T, both, alone


def _tbt(intervals):
    k = math.ceil(0.1 * len(intervals) - 1e-9)
    return sum(sorted(intervals)[-k:]) / k


def test_a_preempted_request_is_recomputed_when_room_frees_and_its_tbt_holds_the_wait():
    res, T, both, alone = _two_requests("recompute")
    stall = COST.prefill_time()(1050, 0)  # B's prompt and its 50 tokens prefilled again on the decode instance
    end_a = T + sum(both) + sum(alone)
    # B rejoins at A's end; its first iteration there is stalled by the recompute
    end_b = end_a + stall + sum(alone)
    assert res.outcome.tolist() == [COMPLETED, COMPLETED]
    assert res.end_s.tolist() == pytest.approx([end_a, end_b], rel=1e-12)
    m = res.metrics
    assert (m["preempted"], m["preemptions"], m["recomputed_tokens"]) == (0, 1, 1050)
    assert m["preemption_stall_s"] == pytest.approx(stall, rel=1e-12)
    # B's intervals: 50 in the pair, then from its 51st token to its next: A's 149 iterations, the
    # stall and one iteration alone, then 148 more
    b = both + [sum(alone) + stall + alone[0]] + alone[1:]
    assert res.tbt_s[1] == pytest.approx(_tbt(b), rel=1e-12)
    assert res.tbt_s[0] == pytest.approx(_tbt(both + alone), rel=1e-12)


def test_a_swapped_request_stalls_its_preemption_and_its_return_by_the_pcie_copy():
    res, T, both, alone = _two_requests("swap")
    swap = 1050 * COST.model.kv_bytes_per_token / COST.instance.tier_bandwidth("dram")  # one way over PCIe
    end_a = T + sum(both) + swap + sum(alone)  # the swap-out holds A's 51st iteration
    end_b = end_a + swap + sum(alone)  # the swap-in holds B's first iteration back
    assert res.end_s.tolist() == pytest.approx([end_a, end_b], rel=1e-12)
    m = res.metrics
    assert (m["preemptions"], m["recomputed_tokens"]) == (1, 0)
    assert m["preemption_stall_s"] == pytest.approx(2 * swap, rel=1e-12)
    a = both + [swap + alone[0]] + alone[1:]
    # B's last token before the swap is at boundary 50, before the swap-out
    b = both + [swap + sum(alone) + swap + alone[0]] + alone[1:]
    assert res.tbt_s.tolist() == pytest.approx([_tbt(a), _tbt(b)], rel=1e-12)


def test_abort_still_ends_the_preempted_request():
    res, _, _, _ = _two_requests("abort")
    assert res.outcome.tolist() == [COMPLETED, PREEMPTED] and "preemptions" not in res.metrics


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_every_request_ends_once_under_heavy_preemption(mode):
    rng = np.random.default_rng(3)
    n = 120
    tr = trace_of(*[(0.05 * k, int(rng.integers(200, 3000)), int(rng.integers(2, 400))) for k in range(n)])
    p = get_preset("mooncake").with_(n_prefill=2, n_decode=2, decode_capacity_tokens=8_000, preemption=mode)
    sim = ClusterSimulator(tr, p, decode_check="kv")
    view = sim.view
    while view is not None:
        view = sim.step(True)
    res = sim.result()
    m = res.metrics
    assert m["preemptions"] > 10  # the case is one of heavy preemption
    assert (res.outcome >= 0).all()
    assert m["completed"] + m["rejected_after_prefill"] + m["preempted"] + m["refused_too_long"] == n
    done = res.outcome == COMPLETED
    assert (res.end_s[done] >= res.decode_start_s[done]).all() and np.isfinite(res.tbt_s[done]).all()
    assert all(not d.waiting for d in sim.decode)


# --- KV transfers over shared NICs ---------------------------------------------------------------------
B = 100e9  # bytes/s per NIC in these tests


def test_a_nic_splits_its_bandwidth_among_its_transfers():
    from mooncake_gym.sim.network import Network
    net = Network(3, B)
    net.add(0.0, 0, 2, 1e9, "a")  # alone: 10 ms at B
    assert net.next_s == pytest.approx(0.01, rel=1e-12)
    net.add(0.004, 1, 2, 1e9, "b")  # node 2 receives both from 4 ms on: B / 2 each
    # a: 0.6e9 bytes left at 4 ms, at B / 2: drains at 4 + 12 = 16 ms
    assert net.next_s == pytest.approx(0.016, rel=1e-12)
    assert net.drained(0.016) == ["a"]
    # b: 0.6e9 sent by 16 ms (at B / 2 for 12 ms), 0.4e9 left alone at B: 4 ms more
    assert net.next_s == pytest.approx(0.020, rel=1e-12)
    assert net.drained(0.020) == ["b"] and net.next_s == math.inf
    net.add(1.0, 0, 1, 1e9, "c")  # one sender, two receivers: the sender's NIC is shared
    net.add(1.0, 0, 2, 2e9, "d")
    assert net.next_s == pytest.approx(1.02, rel=1e-12)  # c at B / 2
    assert net.drained(net.next_s) == ["c"]
    assert net.next_s == pytest.approx(1.03, rel=1e-12)  # d: 1e9 left at B
    with pytest.raises(ValueError, match="bandwidth"):
        Network(2, 0.0)


def test_incast_at_a_decode_node_delays_the_first_token_interval():
    # two prompts prefilled at once on two prefill nodes, both sent to decode instance 0: the copies'
    # tails (what outlasts the prefill, streamed layer by layer) share its NIC, half the bandwidth each
    n = 4000
    p = get_preset("mooncake").with_(n_prefill=2, n_decode=2)
    from mooncake_gym.sim.views import ClusterAction
    sim = ClusterSimulator(trace_of((0.0, n, 3), (0.0, n, 3)), p)
    sim.step(ClusterAction(True, Route(0), 0))
    sim.step(ClusterAction(True, Route(1), 0))
    res = sim.result()
    T = COST.prefill_s(n)
    assert res.ttft_s.tolist() == pytest.approx([T, T], rel=1e-12)
    copy = COST.transfer_s(n)
    tail = max(0.0, copy - T) + copy / COST.model.n_layers  # alone: the last layer's share after the prefill
    join = T + 2 * tail  # both tails through one NIC at half its bandwidth: twice as long
    assert res.decode_start_s.tolist() == pytest.approx([join, join], rel=1e-9)
    steps = [COST.decode_step_s(2, 2 * n + 2 * k) for k in range(2)]
    # the first interval: from the first token (the prefill's end) to the end of the first iteration
    assert res.end_s.tolist() == pytest.approx([join + sum(steps)] * 2, rel=1e-9)
    assert res.tbt_s.tolist() == pytest.approx([join - T + steps[0]] * 2, rel=1e-9)
    # with a NIC each (the other decode instance for the second), no wait: the tail alone
    sim = ClusterSimulator(trace_of((0.0, n, 3), (0.0, n, 3)), p)
    sim.step(ClusterAction(True, Route(0), 0))
    sim.step(ClusterAction(True, Route(1), 1))
    assert sim.result().decode_start_s.tolist() == pytest.approx([T + tail] * 2, rel=1e-9)
    assert sim.network.transfers == 2


def test_a_pull_over_an_idle_nic_takes_the_transfer_time_and_then_the_prefill():
    # request 0 brings a prefix of 10 blocks to prefill node 0; request 1 (the prefix + 1,000 tokens)
    # comes when everything is idle and is sent to node 1 with a pull: copy, then prefill of the rest
    p = get_preset("mooncake").with_(n_prefill=2, n_decode=1)
    prefix = tuple(range(10))
    tr = Trace([0.0, 30.0], [5120, 6120], [2, 2], [prefix, prefix + (10, 11)])
    from mooncake_gym.sim.views import ClusterAction
    sim = ClusterSimulator(tr, p)
    sim.step(ClusterAction(True, Route(0), None))
    sim.step(ClusterAction(True, Route(1, True), None))
    res = sim.result()
    assert res.metrics["fetched_tokens"] == 5120
    assert res.ttft_s[1] == pytest.approx(COST.transfer_s(5120) + COST.prefill_s(6120, 5120), rel=1e-9)


# --- chunked pipeline parallelism --------------------------------------------------------------------
def test_a_long_prompt_is_pipelined_over_its_group_and_holds_it():
    # 4 instances in groups of 2 ({0, 1}, {2, 3}); prompts of >= 16,384 tokens are pipelined.
    # A: 20,000 tokens on instance 0 at 0 -> chunks of 8,192, 8,192 and 3,616 through 2 stages
    # (instance 0, then 1); B, C, D: 1,000 tokens at 0.1 s on instances 1, 2 and 0: B waits for stage
    # 1 to finish A's last chunk, D for stage 0 to, C (the other group) for nothing
    cfg = RoutingConfig(4, 0, 30.0)
    tr = trace_of((0.0, 20_000, 5), (0.1, 1000, 5), (0.1, 1000, 5), (0.1, 1000, 5))
    sim = RoutingSimulator(tr, cfg, COST, batching=PrefillBatching(8192, 2, 16_384))
    for target in (0, 1, 2, 0):
        sim.step(Route(target))
    res = sim.result()
    ovh = COST.instance.iteration_overhead_s  # each stage's iteration pays it whole
    send_per_token = COST.model.d_model * 2 / 100e9  # BF16 activations over 800 Gbps
    chunks = [(0, 8192), (8192, 16_384), (16_384, 20_000)]
    stage = [(PT.iteration_s(c(p, e), e - p, a(p, e)) - ovh) / 2 + ovh for p, e in chunks]
    send = [COST.transfer_latency_s + send_per_token * (e - p) for p, e in chunks]
    # stage 0 runs the chunks back to back; stage 1 takes chunk k after its send and after chunk k - 1
    f0 = [stage[0], stage[0] + stage[1], stage[0] + stage[1] + stage[2]]
    f1 = []
    for k in range(3):
        begin = max(f0[k] + send[k], f1[-1] if f1 else 0.0)
        f1.append(begin + stage[k])
    end_a = f1[-1] + OVH  # and the request's own overhead
    assert end_a < COST.prefill_s(20_000)  # faster than on one instance
    assert res.ttft_s[0] == pytest.approx(end_a, rel=1e-12)
    one = COST.prefill_s(1000)
    assert res.ttft_s[1:].tolist() == pytest.approx([f1[-1] + one - 0.1, one, f0[-1] + one - 0.1], rel=1e-12)
    assert sim.instances[0].engine.pipelined_runs == 1
    # the cluster gives the same first tokens
    p = get_preset("mooncake").with_(n_prefill=4, n_decode=1, pipeline_nodes=2, pipeline_min_tokens=16_384)
    from mooncake_gym.sim.views import ClusterAction
    cs = ClusterSimulator(tr, p)
    for target in (0, 1, 2, 0):
        cs.step(ClusterAction(True, Route(target), None))
    assert cs.result().ttft_s.tolist() == res.ttft_s.tolist()
    with pytest.raises(ValueError, match="pipeline_nodes"):
        PrefillBatching(8192, 0)
    with pytest.raises(ValueError, match="pipeline_nodes"):
        p.with_(prefill_token_budget=0, shared_nics=False)  # a pipeline needs the budget (its chunks)
