"""PPO on OverloadAdmission-v1 with the output-length prediction (not the oracle), capped by wall time.

The attempt of ``docs/admission-v1.md`` (``mooncake_gym/agents/train.py`` knows the v0 env ids only)::

    .venv/bin/python benchmarks/admission_v1_ppo.py OUT_DIR MINUTES [GAMMA]

writes ``OUT_DIR/model.zip`` every 20,000 steps and at the end; evaluate it with
``mooncake_gym.evaluation.episodes.evaluate`` on the scenarios' held-out seeds, or save it with its card
(``mooncake_gym.agents.save_agent``) for ``mooncake-gym compare --scenario admission-load2 --agent
PATH``. Not a speed benchmark.
"""

import sys
import time

import torch

torch.set_num_threads(1)

import mooncake_gym  # noqa: E402,F401  (registers the environments)
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

ENV_KWARGS = {"render_mode": None, "prediction": True, "load_range": (1.5, 3.5), "episode_requests": 1000}


class WallClock(BaseCallback):
    """Stop after ``minutes``; save the model every 20,000 steps."""

    def __init__(self, out: str, minutes: float):
        super().__init__()
        self.out, self.limit_s, self.start, self.last = out, minutes * 60, time.time(), 0

    def _on_step(self) -> bool:
        if self.num_timesteps - self.last >= 20000:
            self.last = self.num_timesteps
            print(self.num_timesteps, round(time.time() - self.start), flush=True)
            self.model.save(self.out + "/model")
        return time.time() - self.start < self.limit_s


def main(out: str, minutes: float, gamma: float = 0.99) -> None:
    venv = make_vec_env("mooncake_gym/OverloadAdmission-v1", n_envs=4, seed=0, env_kwargs=ENV_KWARGS,
                        vec_env_cls=DummyVecEnv)
    model = PPO("MlpPolicy", venv, n_steps=512, batch_size=256, n_epochs=10, learning_rate=3e-4, gamma=gamma,
                gae_lambda=0.95, ent_coef=0.0, policy_kwargs={"net_arch": [128, 128]}, seed=0, verbose=0)
    model.learn(total_timesteps=10_000_000, callback=WallClock(out, minutes))
    model.save(out + "/model")
    print("done", model.num_timesteps, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), *(float(x) for x in sys.argv[3:4]))
