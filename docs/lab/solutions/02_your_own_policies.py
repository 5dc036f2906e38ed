"""Solutions to the checked exercises of ``02_your_own_policies.py`` (run: ``python 02_your_own_policies.py``)."""

from mooncake_gym.course import lab
from mooncake_gym.sim.routing import Route


def best_instance(view):
    """Algorithm 1 without pulls: the smallest estimated TTFT (queue + prefill given the local hit)."""
    return min(range(view.n_instances), key=view.ttft_s)


def my_router(view):
    """Algorithm 1: the smallest estimate over every instance, with and without pulling the best
    prefix there first (a pull only where another instance holds a longer prefix)."""
    options = [(view.ttft_s(i), i, False) for i in range(view.n_instances)]
    if view.best_hit_tokens > 0:
        options += [(view.ttft_s(i, pull=True), i, True) for i in range(view.n_instances)
                    if view.hit_tokens[i] < view.best_hit_tokens]
    _, instance, pull = min(options)
    return Route(instance, pull=True) if pull else instance


def decode_fits(view):
    """The request's expected KV (input + the workload's mean output) fits on the emptiest decode instance now."""
    need = view.input_tokens + view.mean_output_tokens
    return min(view.decode_used_per_instance) + need <= view.decode_capacity_per_instance


def my_admission(view):
    """The TTFT check, then the decode pool projected to the moment this request's prefill ends
    (the median remaining decode time of each running request, from the workload's distribution),
    trusted only half a mean decode time ahead: predict_dist's rule with its defaults."""
    if view.predicted_ttft_s > view.ttft_slo_s or view.predicted_ttft_s > 0.5 * view.mean_decode_s:
        return False
    projected = view.project_decode(view.predicted_prefill_finish, quantile=0.5)
    need = view.input_tokens + view.mean_output_tokens
    return min(projected) + need <= 1.05 * view.decode_capacity_per_instance


passed = [lab.check("best-instance", best_instance), lab.check("router", my_router),
          lab.check("router-pulls", my_router), lab.check("decode-fits", decode_fits),
          lab.check("admission", my_admission)]
raise SystemExit(0 if all(passed) else 1)
