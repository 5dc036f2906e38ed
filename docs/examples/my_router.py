"""A routing policy of your own, for every command that takes ``--policy``:

    mooncake-gym replay --policy docs/examples/my_router.py:shortest_ttft
    mooncake-gym sweep --policy kvcentric,docs/examples/my_router.py:shortest_ttft --loads 0.5,0.9

A routing policy is a function of the simulator's ``RoutingView`` (``mooncake_gym.sim.views``)
returning the instance to prefill the request on (an ``int``), or a ``Route(instance, pull)`` to
first pull the best prefix held elsewhere. This one is Algorithm 1 without its balancing threshold:
the instance with the smallest estimated TTFT, pulling the best prefix where that is faster.
"""

from mooncake_gym.sim.views import Route


def shortest_ttft(view):
    best, best_ttft, best_pull = 0, float("inf"), False
    for i in range(len(view.queue_s)):
        for pull in (False, True):
            ttft = view.ttft_s(i, pull=pull)
            if ttft < best_ttft:
                best, best_ttft, best_pull = i, ttft, pull
    return Route(best, best_pull)
