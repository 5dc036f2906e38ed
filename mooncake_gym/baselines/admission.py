"""Admission baselines for the lecture's admission problem and the cluster (Mooncake v3 §7): ``view -> admit?``.

Every policy first applies Algorithm 1's prefill check at arrival: reject when the predicted TTFT
(queue + prefill on the least loaded prefill instance, exact in the simulator) exceeds the TTFT SLO
(default: the run's, 30 s as in the paper). They differ in when and how they look at decode:

- ``baseline``: never at arrival; the decode pool checks only after prefill (the paper's baseline).
- ``early``: early rejection (§7.2) on the greater of prefill and decode load *now*.
- ``predict``: early rejection based on prediction (§7.4), every request decoding a uniform t_d.
- ``predict_dist``: like ``predict`` but with the decode-time distribution instead of one t_d
  (not in the paper: an attempt at the open problem of lecture demo 3).
- ``size_oracle`` / ``size_predicted`` (the cluster simulator only, ``OverloadAdmission-v1``):
  admit the smaller decode footprints ((input + output) x output) when the decode pool is loaded,
  with the exact output length (a reference: needs ``oracle=True``) or the predicted one (needs
  ``prediction=True``; ``mooncake_gym.model.prediction``).
- ``context_oracle`` / ``context_predicted``: the same rule on the KV context per output token
  (input + output), the measure that token goodput rewards.

``ADMISSION_POLICIES`` maps each name to a factory (keyword arguments are the thresholds).
``ADMISSION_V1_POLICIES`` are the policies of the v1 problem (``OverloadAdmission-v1``): the four
above and the four size rules. A class's ``KNOBS`` (``{parameter: [values]}``, its default among them) is the grid that
``mooncake-gym tune`` searches; ``baseline`` has none.
"""

from __future__ import annotations


class _Admission:
    """Shared part: the prefill (TTFT) check of Algorithm 1."""

    name = "admission"

    def __init__(self, ttft_slo_s: float | None = None):
        if ttft_slo_s is not None and not ttft_slo_s > 0:
            raise ValueError(f"ttft_slo_s: expected > 0 seconds or None (the run's SLO), got {ttft_slo_s}")
        self.ttft_slo_s = ttft_slo_s

    def _slo(self, view) -> float:
        return view.ttft_slo_s if self.ttft_slo_s is None else self.ttft_slo_s

    def prefill_ok(self, view) -> bool:
        return view.predicted_ttft_s <= self._slo(view)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


class BaselineAdmission(_Admission):
    """Admit iff predicted TTFT <= TTFT SLO. Decode is not looked at: a request that finds no decode
    room when its prefill finishes is rejected then, and its prefill is wasted."""

    name = "baseline"

    def __call__(self, view) -> bool:
        return view.predicted_ttft_s <= self._slo(view)


def _fraction(name: str, v: float, upper: float = 1.0) -> float:
    if not (isinstance(v, (int, float)) and 0 < v <= upper):
        raise ValueError(f"{name}: expected 0 < {name} <= {upper:g}, got {v!r}")
    return float(v)


def _own_tokens(view) -> float:
    """Decode tokens this request is expected to need: its prompt plus the workload's mean output
    (its own output length is unknown at arrival)."""
    return view.input_tokens + view.mean_output_tokens


def decode_load_with(view, own_tokens: float | None = None) -> float:
    """The decode load of the least loaded decode instance once this request is on it (not the
    pool-wide ``view.decode_load``): the instance Algorithm 1 would choose. An instance's load is
    its KV use (used + this prompt + the workload's mean output, over its capacity) and, where the
    view predicts iteration times (the cluster simulator's continuous batching), the greater of that
    and the predicted iteration time with this request over the TBT SLO (Mooncake §7: load as SLO
    satisfaction). ``own_tokens`` replaces prompt + mean output when given."""
    own = _own_tokens(view) if own_tokens is None else own_tokens
    cap = view.decode_capacity_per_instance
    kv = [(u + own) / cap for u in view.decode_used_per_instance]
    steps = getattr(view, "decode_step_with_s", None)
    if steps is None:
        return min(kv)
    slo = view.tbt_slo_s
    return min(k if k > s / slo else s / slo for k, s in zip(kv, steps))


class EarlyRejection(_Admission):
    """Early rejection (Mooncake v3 §7.2): reject at arrival when the load is at its limit, the load
    being the greater of the prefill load and the decode load, both looked at *now*:

    - prefill load = predicted TTFT / TTFT SLO;
    - decode load = (used tokens of the least loaded decode instance + this request's prompt + the
      workload's mean output) / that instance's capacity — the decode instance Algorithm 1 would
      choose by load, with this request on it; on the cluster simulator also its predicted
      iteration time over the TBT SLO (:func:`decode_load_with`).

    Admit iff max(prefill load, decode load) <= ``threshold`` (default 1.0: the request would fit on
    the emptiest decode instance now). Prefill and decode load then swing in anti-phase (v3 §7.3).
    """

    name = "early"
    KNOBS = {"threshold": [0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0]}

    def __init__(self, threshold: float = 1.0, ttft_slo_s: float | None = None):
        super().__init__(ttft_slo_s)
        self.threshold = _fraction("threshold", threshold, 2.0)

    def __call__(self, view) -> bool:
        slo = self._slo(view)
        if view.predicted_ttft_s > slo:
            return False
        return max(view.predicted_ttft_s / slo, decode_load_with(view)) <= self.threshold


class PredictiveRejection(_Admission):
    """Early rejection based on prediction (Mooncake v3 §7.4): assume every request decodes for the
    same time t_d (``decode_s``, default the workload's mean decode time), project the decode pool to
    the moment this request's prefill would finish — add the requests whose prefill finishes by then,
    remove those whose decode ends by then (``AdmissionView.project_decode``) — and admit iff
    predicted TTFT <= SLO and the projected decode pool takes the request:

    - under continuous batching (the cluster's realistic presets), the paper's test: the predicted
      TBT, the iteration time of the fastest projected decode instance with this request on it
      (``ClusterView.project_decode_step_s``), is within ``threshold`` x the TBT SLO;
    - under the lecture's reserve model, where the KV reservation is what binds: the request (prompt
      + mean output) fits on the emptiest projected instance, min(projected) + tokens <=
      ``threshold`` x instance capacity.

    ``threshold`` defaults to 1.0.

    On a long-tailed output distribution the single t_d predicts badly: a request that has decoded
    longer than t_d is counted as gone although it will often run much longer.
    """

    name = "predict"
    KNOBS = {"threshold": [0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2.0]}

    def __init__(self, threshold: float = 1.0, decode_s: float | None = None, ttft_slo_s: float | None = None):
        super().__init__(ttft_slo_s)
        self.threshold = _fraction("threshold", threshold, 2.0)
        if decode_s is not None and not decode_s > 0:
            raise ValueError(f"decode_s: expected > 0 seconds or None (the workload's mean), got {decode_s}")
        self.decode_s = decode_s

    def __call__(self, view) -> bool:
        if view.predicted_ttft_s > self._slo(view):
            return False
        steps = getattr(view, "project_decode_step_s", None)
        steps = None if steps is None else steps(view.predicted_prefill_finish, decode_s=self.decode_s)
        if steps is not None:
            fits = [s for s in steps if s is not None]
            return bool(fits) and min(fits) <= self.threshold * view.tbt_slo_s
        projected = view.project_decode(view.predicted_prefill_finish, decode_s=self.decode_s)
        return min(projected) + _own_tokens(view) <= self.threshold * view.decode_capacity_per_instance


class DistributionPredictiveRejection(_Admission):
    """Prediction with the decode-time *distribution* instead of one t_d (not in the paper).

    The same projection and rule as ``predict``, but a request that has already decoded k tokens is
    assumed to end at the ``quantile`` (default 0.5, the median) of the workload's output lengths
    longer than k: on a long-tailed distribution a request that has run long is expected to run on,
    instead of being counted as gone. New requests (still in prefill) decode the mean time.
    Admit iff predicted TTFT <= SLO, predicted TTFT <= ``horizon_s`` and
    min(projected) + prompt + mean output <= ``threshold`` x instance capacity.

    - ``threshold`` (default 1.05): the median-based projection is a little pessimistic (it does not
      count the room freed by the requests that end before their median), so admitting up to 5 %
      over the projected room fills decode better while still wasting far less prefill than baseline.
    - ``horizon_s`` (default None: half the workload's mean decode time): the projection is trusted
      only this far ahead. Further ahead the decode pool at the prefill finish is made mostly of
      requests not admitted yet, which the projection cannot see; admitting on it lets a long prefill
      queue build up and the policy falls back into baseline's behaviour (long lag, much waste).
    """

    name = "predict_dist"
    KNOBS = {"threshold": [0.95, 1.0, 1.05, 1.1, 1.2, 1.5], "quantile": [0.25, 0.5, 0.75]}

    def __init__(self, threshold: float = 1.05, quantile: float = 0.5, horizon_s: float | None = None,
                 ttft_slo_s: float | None = None):
        super().__init__(ttft_slo_s)
        self.threshold = _fraction("threshold", threshold, 2.0)
        if not (isinstance(quantile, (int, float)) and 0 < quantile < 1):
            raise ValueError(f"quantile: expected 0 < quantile < 1, got {quantile!r}")
        self.quantile = float(quantile)
        if horizon_s is not None and not horizon_s > 0:
            raise ValueError(f"horizon_s: expected > 0 seconds or None (half the mean decode time), got {horizon_s}")
        self.horizon_s = horizon_s

    def __call__(self, view) -> bool:
        horizon = 0.5 * view.mean_decode_s if self.horizon_s is None else self.horizon_s
        if view.predicted_ttft_s > self._slo(view) or view.predicted_ttft_s > horizon:
            return False
        projected = view.project_decode(view.predicted_prefill_finish, quantile=self.quantile)
        return min(projected) + _own_tokens(view) <= self.threshold * view.decode_capacity_per_instance


class FootprintRule(_Admission):
    """The size rule on the decode footprint (cluster simulator only; ``size_oracle``, ``size_predicted``).

    A request's decode footprint is ``F = (input + out) x out`` tokens x iterations, ``out`` its
    output length: about the KV it holds times how long it holds it, i.e. its share of the decode
    pool's memory and of its iterations' KV reads. Under overload the pool serves more requests, and
    more of them within the TBT SLO, if it spends that resource on small footprints. Exactly, with
    ``load = decode_load_with(view, input + out)`` (the emptiest decode instance's KV use and
    predicted iteration time over the TBT SLO once this request is on it, the greater of the two):

    admit iff predicted TTFT <= TTFT SLO and (``load <= low``, or ``load <= high`` and
    ``F <= max_footprint``).

    Below ``low`` the pool is not loaded and anything fits; between ``low`` and ``high`` only the
    small footprints; above ``high`` nothing. The footprint ranks requests by their decode cost *per
    request*, which is what the number of good requests rewards; :class:`ContextRule` ranks them by
    cost per output token, which is what token goodput rewards. ``length``: ``"oracle"`` reads the exact output
    length (``view.output_tokens``: the env needs ``oracle=True``; a reference, not a deployable
    policy), ``"predicted"`` a predictor's (``view.predicted_output_tokens``: ``prediction=True``).
    """

    name = "size"
    KNOBS = {"low": [0.5, 0.6, 0.7, 0.8], "high": [0.8, 0.9, 1.0],
             "max_footprint": [2.5e5, 5e5, 1e6, 2e6]}
    LENGTHS = ("oracle", "predicted")

    def __init__(self, low: float = 0.6, high: float = 0.9, max_footprint: float = 5e5, length: str = "predicted",
                 ttft_slo_s: float | None = None):
        super().__init__(ttft_slo_s)
        self.low = _fraction("low", low, 2.0)
        self.high = _fraction("high", high, 2.0)
        if self.high < self.low:
            raise ValueError(f"high: expected high >= low ({low}), got {high!r}")
        if not (isinstance(max_footprint, (int, float)) and max_footprint > 0):
            raise ValueError(f"max_footprint: expected > 0 tokens x iterations, got {max_footprint!r}")
        self.max_footprint = float(max_footprint)
        if length not in self.LENGTHS:
            raise ValueError(f"length: expected one of {self.LENGTHS}, got {length!r}")
        self.length = length

    def output_of(self, view) -> float:
        out = view.output_tokens if self.length == "oracle" else getattr(view, "predicted_output_tokens", None)
        if out is None:
            need = "oracle=True" if self.length == "oracle" else "prediction=True"
            raise ValueError(f"length: the {self.length} output length is not in the view; make the env with {need} "
                             "(OverloadAdmission-v1 or Conductor-v1)")
        return out

    def size(self, input_tokens: int, out: float) -> float:
        """The measure compared with ``max_footprint``: the decode footprint."""
        return (input_tokens + out) * out

    def __call__(self, view) -> bool:
        if view.predicted_ttft_s > self._slo(view):
            return False
        out = self.output_of(view)
        load = decode_load_with(view, view.input_tokens + out)
        if load <= self.low:
            return True
        return load <= self.high and self.size(view.input_tokens, out) <= self.max_footprint


class ContextRule(FootprintRule):
    """:class:`FootprintRule` on the KV context per output token, ``input + out`` (``context_oracle``,
    ``context_predicted``): the footprint divided by the output length. A decode iteration's time
    and the pool's KV grow with the contexts of the batch, and each request in it earns one token per
    iteration, so a request's cost per token of goodput is about its context: under load, admit the
    requests with ``input + out <= max_footprint`` (here in tokens). It depends on the output length
    only through ``out`` beside a prompt of thousands of tokens, so a noisy prediction costs little."""

    name = "context"
    KNOBS = {"low": [0.5, 0.6, 0.7, 0.8], "high": [0.8, 0.9, 1.0], "max_footprint": [4000, 6000, 8000, 12000]}

    def __init__(self, low: float = 0.7, high: float = 0.9, max_footprint: float = 8000, length: str = "predicted",
                 ttft_slo_s: float | None = None):
        super().__init__(low, high, max_footprint, length, ttft_slo_s)

    def size(self, input_tokens: int, out: float) -> float:
        return input_tokens + out


def _with_length(cls, length: str, env_kwargs: dict):
    """A factory of ``cls`` with ``length`` fixed; ``KNOBS`` of the class, ``ENV_KWARGS`` the env
    arguments it needs beyond a scenario's (``compare`` makes its env with them)."""
    def factory(**kwargs):
        return cls(length=length, **kwargs)

    factory.__name__ = factory.__qualname__ = f"{cls.name}_{length}"
    factory.__doc__ = f":class:`{cls.__name__}` with the {length} output length (the env needs {env_kwargs})."
    factory.KNOBS = cls.KNOBS
    factory.ENV_KWARGS = env_kwargs
    return factory


size_oracle = _with_length(FootprintRule, "oracle", {"oracle": True})
size_predicted = _with_length(FootprintRule, "predicted", {"prediction": True})
context_oracle = _with_length(ContextRule, "oracle", {"oracle": True})
context_predicted = _with_length(ContextRule, "predicted", {"prediction": True})

ADMISSION_POLICIES = {
    "baseline": BaselineAdmission,
    "early": EarlyRejection,
    "predict": PredictiveRejection,
    "predict_dist": DistributionPredictiveRejection,
}

#: The policies of the v1 admission problem (``OverloadAdmission-v1``, the cluster simulator).
ADMISSION_V1_POLICIES = {**ADMISSION_POLICIES, "size_oracle": size_oracle, "size_predicted": size_predicted,
                         "context_oracle": context_oracle, "context_predicted": context_predicted}


def make_admission_policy(name: str, **kwargs):
    """An admission policy by name (see ``ADMISSION_POLICIES``)."""
    if name not in ADMISSION_POLICIES:
        raise ValueError(f"policy: unknown admission policy {name!r}; expected one of {sorted(ADMISSION_POLICIES)}")
    return ADMISSION_POLICIES[name](**kwargs)
