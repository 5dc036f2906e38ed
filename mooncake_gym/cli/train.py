"""``mooncake-gym train``: train an agent (stable-baselines3 / sb3-contrib, or Ray RLlib PPO)."""

from __future__ import annotations

from mooncake_gym.agents.rllib import train_rllib
from mooncake_gym.agents.train import check_env_kwargs, parse_env_kwargs, resolve_env, train
from mooncake_gym.cli.options import Command, opt, option

#: the options of stable-baselines3 only, with their defaults (given with --backend rllib: an error)
_SB3 = {"timesteps": None, "tensorboard": None, "algo": "ppo", "env_kwargs": None, "n_envs": None,
        "vec_env": "auto", "vecnormalize": False, "wrapper": None, "no_evaluate": False, "no_progress": False}
_SB3_WHY = {"timesteps": "; with --backend rllib give --iterations",
            "tensorboard": " (RLlib's results are in its checkpoint folder)"}

OPTIONS = (
    opt("--env", required=True, metavar="ID",
        help="routing or admission (the lecture's PrefillRouting-v0 / OverloadAdmission-v0), or any registered "
             "id: PrefillRouting-v1, OverloadAdmission-v1, Conductor-v1, a scenario's (routing-saturated-v1; "
             "docs/scenarios.md)"),
    opt("--algo", choices=["ppo", "a2c", "dqn", "recurrentppo", "maskableppo"], default="ppo",
        help="algorithm (default ppo; recurrentppo and maskableppo need pip install 'mooncake-gym[contrib]')"),
    opt("--env-kwargs", default=None,
        help="env kwargs on top of the recipe's, as JSON or key=value,...: e.g. rate=8, n_instances=4 or, on "
             "the v1 environments, preset=h100 (or preset=FILE.toml); checked against the env's own arguments"),
    opt("--n-envs", type=int, default=None, limit="n_envs", help="parallel training envs (default: mooncake_gym/agents/hyperparams.yml)"),
    opt("--vec-env", choices=["auto", "dummy", "subproc"], default="auto",
        help="run the envs in this process (dummy) or in subprocesses; auto: subprocesses only where "
             "a step is slow enough for them to pay (default auto)"),
    opt("--vecnormalize", action="store_true",
        help="normalise observations with VecNormalize (its statistics are saved in the card)"),
    opt("--wrapper", action="append", default=None, metavar="MODULE.CLASS[:KWARGS]",
        help="observation wrapper around every env (repeatable, innermost first; kwargs as for --env-kwargs)"),
    opt("--timesteps", type=int, default=None, limit="timesteps", help="total timesteps (default: mooncake_gym/agents/hyperparams.yml)"),
    opt("--seed", type=int, default=0, limit="seed", help="training seed (default 0)"),
    opt("--out", default="runs/train", help="output directory (default runs/train)"),
    opt("--tensorboard", default=None, help="TensorBoard log directory"),
    opt("--threads", type=int, default=1, limit="threads", help="torch threads (default 1)"),
    opt("--no-progress", action="store_true", help="no progress bar"),
    opt("--no-evaluate", action="store_true",
        help="skip the card's held-out evaluation next to the baselines (about 20 s)"),
    opt("--backend", choices=["sb3", "rllib"], default="sb3",
        help="stable-baselines3 (default) or Ray RLlib PPO (needs the ray extra; docs/scale-out.md)"),
    opt("--iterations", type=int, default=None, help="rllib: training iterations (default 10)"),
    opt("--num-env-runners", type=int, default=None, help="rllib: remote env runners (default 0: sample in the driver)"),
    opt("--address", default=None, help="rllib: address of a running Ray cluster (default: start Ray locally)"),
)


def wrappers(args) -> list[dict]:
    """``--wrapper MODULE.CLASS[:KWARGS]`` options as the wrapper specs ``train`` takes."""
    out = []
    for text in args.wrapper or []:
        path, sep, kwargs = text.partition(":")
        out.append({"class": path, "kwargs": parse_env_kwargs(kwargs) if sep else {}})
    return out


def check(args) -> None:
    env_id, _ = resolve_env(args.env)
    if args.backend == "rllib":
        if args.env not in ("routing", "admission"):
            raise ValueError(f"--env: --backend rllib trains routing or admission (the v0 environments), "
                             f"not {args.env!r}; train it with --backend sb3")
        for dest, default in _SB3.items():
            if getattr(args, dest) != default:
                raise ValueError(f"{option(dest)}: stable-baselines3 only (--backend sb3){_SB3_WHY.get(dest, '')}")
        return
    for dest in ("iterations", "num_env_runners", "address"):
        if getattr(args, dest) is not None:
            raise ValueError(f"{option(dest)}: for --backend rllib only")
    # a malformed --env-kwargs or --wrapper, or an argument the env does not take, names itself before training
    check_env_kwargs(env_id, parse_env_kwargs(args.env_kwargs))
    wrappers(args)


def run(args) -> int:
    if args.backend == "rllib":
        return _run_rllib(args)
    path = train(args.env, timesteps=args.timesteps, seed=args.seed, out=args.out, tensorboard=args.tensorboard,
                 progress_bar=not args.no_progress, threads=args.threads, algo=args.algo,
                 env_kwargs=parse_env_kwargs(args.env_kwargs), n_envs=args.n_envs, vecnormalize=args.vecnormalize,
                 wrappers=wrappers(args), vec_env=args.vec_env, evaluate_card=not args.no_evaluate)
    print(f"best model: {path}\ncard: {path.with_suffix('.json')}")
    return 0


def _run_rllib(args) -> int:
    """``train --backend rllib``: RLlib PPO, one line per iteration (docs/scale-out.md)."""
    def show(r):
        extra = "  ".join(f"{k} {v:.4g}" for k, v in r.items() if k not in ("iteration", "timesteps"))
        print(f"iteration {r['iteration']:3d}  env steps {r['timesteps']:8d}  {extra}", flush=True)

    train_rllib(args.env, 10 if args.iterations is None else args.iterations,
                num_env_runners=args.num_env_runners or 0, address=args.address,
                seed=args.seed, out=args.out, progress=show, threads=args.threads)
    print(f"RLlib checkpoint: {args.out}")
    return 0


COMMAND = Command("train", "train an agent (stable-baselines3 / sb3-contrib) on one environment", OPTIONS, run, check)
