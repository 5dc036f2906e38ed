"""A noisy output-length predictor: what an admission policy may know of a request's output at arrival.

A server does not know how many tokens a request will generate when it arrives. Production systems
estimate it with a small *proxy model* run on the prompt: a fine-tuned BERT-base classifier in SSJF
(Qiu et al., "Efficient Interactive LLM Serving with Proxy Model-based Sequence Length
Prediction", AIOps workshop at ASPLOS 2024), the served LLM itself asked to perceive its response
length (Zheng et al., "Response Length Perception and Sequence Scheduling", NeurIPS 2023). Such
predictions are good on average and badly wrong for some requests; their error is roughly
multiplicative (an output of 1,000 tokens is mistaken by hundreds, one of 20 by tens).

This module models such a predictor without a model: the prediction of a request with ``o`` output
tokens is ``o * exp(sigma * z)`` with ``z`` standard normal, i.i.d. per request (a log-normal
multiplicative error, median-unbiased; ``sigma`` 0 is the exact length, 0.5 is off by a factor of
1.65 or more for about a third of the requests, 1.0 by 2.7 or more). It is the observation feature
``prediction=True`` of ``OverloadAdmission-v1`` and ``Conductor-v1`` and what the ``size_predicted``
admission baseline reads. ``oracle=True`` (the exact length) stays for bounds and references only.
"""

from __future__ import annotations

import math

import numpy as np

#: The default error of the predictor (log-normal sigma): what the admission scenarios use.
DEFAULT_PREDICTION_SIGMA = 0.5
#: The largest sigma accepted (a factor of e^3 = 20 at one standard deviation: no information left).
MAX_PREDICTION_SIGMA = 3.0


def check_sigma(sigma) -> float:
    """``sigma`` as a float; ``ValueError`` naming ``prediction_sigma`` unless 0 <= sigma <= 3."""
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.integer, np.floating)) \
            or not math.isfinite(sigma) or not 0 <= sigma <= MAX_PREDICTION_SIGMA:
        raise ValueError(f"prediction_sigma: expected a number in [0, {MAX_PREDICTION_SIGMA:g}] (the log-normal "
                         f"error of the output-length predictor), got {sigma!r}")
    return float(sigma)


def predict_output_tokens(output_tokens, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Predicted output lengths (float64, > 0) of requests whose true lengths are ``output_tokens``:
    ``output * exp(sigma * z)``, one standard normal ``z`` per request drawn from ``rng`` in request
    order (drawn even when ``sigma`` is 0, so that the generator advances the same way)."""
    sigma = check_sigma(sigma)
    out = np.asarray(output_tokens, dtype=np.float64)
    z = rng.standard_normal(len(out))
    return out if sigma == 0 else out * np.exp(sigma * z)
