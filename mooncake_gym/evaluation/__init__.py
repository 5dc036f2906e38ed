"""Evaluation: episodes of a policy in an environment (:func:`evaluate`), the problem registry and
the benchmark scenarios."""

from mooncake_gym.evaluation.episodes import (ModelPolicy, ViewPolicy, as_env_policy, check_model_fits, evaluate,
                                              run_episode, torch_threads)

__all__ = ["ModelPolicy", "ViewPolicy", "as_env_policy", "check_model_fits", "evaluate", "run_episode",
           "torch_threads"]
