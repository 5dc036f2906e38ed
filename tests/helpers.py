"""Small workloads built by hand, shared by the tests."""

import math

from mooncake_gym.model.workload import Trace


def trace_of(*requests):
    """(arrival_s, input_tokens, output_tokens) tuples; distinct blocks, no sharing."""
    blocks, nxt = [], 0
    for _, n, _ in requests:
        k = math.ceil(n / 512)
        blocks.append(tuple(range(nxt, nxt + k)))
        nxt += k
    return Trace([r[0] for r in requests], [r[1] for r in requests], [r[2] for r in requests], blocks)
