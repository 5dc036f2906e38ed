"""The ``mooncake-gym`` command line. Every subcommand that prints results takes ``--json``."""

from __future__ import annotations

import argparse
import sys

from mooncake_gym.reporting import tables as report


def _add_trace_args(p: argparse.ArgumentParser, positional: bool = False) -> None:
    if positional:
        p.add_argument("trace", help="a Mooncake JSONL trace file, or 'synthetic'")
    else:
        p.add_argument("--trace", default="synthetic", help="a Mooncake JSONL trace file, or 'synthetic' (default)")
    p.add_argument("--rate", type=float, default=None, help="synthetic trace: session arrivals per second (default 4)")
    p.add_argument("--seed", type=int, default=None, help="synthetic trace: random seed (default 0)")


def _cmd_trace_stats(args) -> int:
    from mooncake_gym.model.workload import load_workload

    stats = load_workload(args.trace, rate=args.rate, seed=args.seed).stats()
    if args.json:
        report.print_json(stats)
    else:
        for k, v in stats.items():
            print(f"{k:>22}: {report.format_cell(v)}")
    return 0


def _cmd_trace_generate(args) -> int:
    from mooncake_gym.model.workload import synthetic_trace, write_trace

    trace = synthetic_trace(args.seed, args.rate, duration_s=args.duration, n_requests=args.requests)
    write_trace(trace, args.output)
    print(f"wrote {len(trace)} requests ({trace.duration_s:.1f} s) to {args.output}", file=sys.stderr)
    return 0


def _cmd_replay(args) -> int:
    from dataclasses import asdict

    from mooncake_gym.sim.observation import as_observation
    from mooncake_gym.baselines import run_baselines
    from mooncake_gym.sim.routing import RoutingConfig
    from mooncake_gym.model.workload import load_workload

    if args.preset != "lecture":  # the whole cluster of a realistic preset (mooncake_gym.experiments.clusterrun)
        from mooncake_gym.experiments.clusterrun import cmd_replay
        return cmd_replay(args)
    trace = load_workload(args.trace, rate=args.rate, seed=args.seed, speed=args.speed)
    config = RoutingConfig(n_instances=args.instances, cache_blocks=args.cache_blocks, ttft_slo_s=args.ttft_slo,
                           instances=args.pool)
    modes = args.observation or ["exact"]
    observations = [as_observation(m) for m in modes]
    names = None if args.policy == "all" else [args.policy]
    by_mode = {mode: run_baselines("routing", trace, names, config, seed=args.seed, threshold=args.threshold,
                                   observation=observation)
               for mode, observation in zip(modes, observations)}
    if args.tuned:  # each tuned baseline right after its default row, under every observation mode
        from mooncake_gym.experiments.compare import with_tuned
        from mooncake_gym.sim.routing import simulate

        for mode, observation in zip(modes, observations):
            runs = by_mode[mode]
            by_mode[mode] = {name: runs[name] if policy is None else
                             simulate(trace, policy.policy, config, seed=args.seed, observation=observation)
                             for name, policy in with_tuned(dict.fromkeys(runs), "routing", args.tuned_docs).items()}
    if args.json:
        config_json = vars(config) if config.instances is None else \
            {**vars(config), "instances": [asdict(spec) for spec in config.instances]}
        doc = {"trace": trace.name, "requests": len(trace), "rate_per_s": trace.rate, "config": config_json}
        if len(modes) == 1:
            doc["observation"] = asdict(observations[0])
            doc["results"] = {n: r.metrics for n, r in by_mode[modes[0]].items()}
        else:  # one entry per --observation
            doc["observation"] = {mode: asdict(o) for mode, o in zip(modes, observations)}
            doc["results"] = {mode: {n: r.metrics for n, r in res.items()} for mode, res in by_mode.items()}
        report.print_json(doc)
        return 0
    columns = report.ROUTING_COLUMNS
    if len(modes) > 1:
        columns = [columns[0], ("observation", "observation", None), *columns[1:]]
    rows = [{**report.routing_row(name, r.metrics), "observation": mode}
            for mode, res in by_mode.items() for name, r in res.items()]
    pool = f" ({args.pool})" if args.pool else ""
    seen = "" if len(modes) > 1 or observations[0].exact else f"; observation {modes[0]}"
    print(f"{trace.name}: {len(trace)} requests, {trace.rate:.2f} requests/s; "
          f"{config.n_instances} instances{pool} x {config.cache_blocks} blocks, "
          f"TTFT SLO {config.ttft_slo_s:g} s{seen}" + ("\n" if args.markdown else ""))
    print(report.format_table(rows, columns, markdown=args.markdown))
    return 0


def _cmd_overload(args) -> int:
    """``mooncake-gym overload``: admission baselines on demo 3's workload (or another base trace)."""
    from mooncake_gym.baselines import run_baselines
    from mooncake_gym.sim.admission import OverloadConfig, overload_workload
    from mooncake_gym.model.workload import load_workload

    if args.preset != "lecture":  # the whole cluster of a realistic preset (mooncake_gym.experiments.clusterrun)
        from mooncake_gym.experiments.clusterrun import cmd_overload
        return cmd_overload(args)
    pools = {k: v for k, v in (("n_prefill", args.prefill_instances), ("n_decode", args.decode_instances))
             if v is not None}
    config = OverloadConfig(ttft_slo_s=args.ttft_slo, **pools)
    base = load_workload(args.trace, rate=args.rate, seed=args.seed)
    trace, sat = overload_workload(base, args.load, args.requests, args.seed, config.preset(), pool="decode")
    capacity = sat.decode_per_s
    names = None if args.policy == "all" else [args.policy]
    results = run_baselines("admission", trace, names, config, seed=args.seed)
    if args.plot:
        from mooncake_gym.reporting.plots import plot_load_series

        plot_load_series(results, args.plot, title=f"{trace.name}: prefill and decode load")
    if args.json:
        report.print_json({"base_trace": base.name, "trace": trace.name, "requests": len(trace),
                           "decode_capacity_per_s": capacity, "load": args.load,
                           "arrival_rate_per_s": args.load * capacity, "config": vars(config),
                           "results": {n: r.metrics for n, r in results.items()}})
        return 0
    print(f"base {base.name}: decode pool capacity {capacity:.2f} requests/s "
          f"({config.n_decode} x {config.decode_capacity_tokens:,} tokens, TBT {config.tbt_s:g} s); "
          f"{len(trace):,} i.i.d. requests at load {args.load:g} = {args.load * capacity:.2f}/s; "
          f"{config.n_prefill} prefill instances, TTFT SLO {config.ttft_slo_s:g} s")
    print(report.format_table([report.overload_row(r.metrics) for r in results.values()], report.OVERLOAD_COLUMNS))
    if args.plot:
        print(f"load series written to {args.plot}")
    return 0


def _cmd_cache(args) -> int:
    """The ``mooncake-gym cache`` handler."""
    from mooncake_gym.analysis.cache import analyze_cache, parse_blocks, parse_gib, parse_policies
    from mooncake_gym.model.costmodel import get_model
    from mooncake_gym.model.workload import load_workload

    # check the arguments before reading or generating a trace
    if args.blocks is not None:
        parse_blocks(args.blocks)
    if args.gib is not None:
        parse_gib(args.gib)
    parse_policies(args.policies)
    get_model(args.model)
    trace = load_workload(args.trace, rate=args.rate, seed=args.seed)
    analysis = analyze_cache(
        trace,
        blocks=args.blocks,
        gib=args.gib,
        model=args.model,
        policies=args.policies,
        window=args.window,
    )
    if args.plot:
        from mooncake_gym.reporting.plots import plot_hit_rate

        plot_hit_rate(analysis, args.plot)
    if args.json:
        report.print_json(analysis.to_dict())
        return 0
    print(f"{analysis.trace_name}: {analysis.requests:,} requests, {analysis.distinct_blocks:,} distinct blocks; "
          f"window {analysis.window}: {analysis.requests - analysis.warmup_requests:,} requests measured "
          f"after {analysis.warmup_requests:,} warm-up, {analysis.measured_tokens:,} tokens")
    print(report.cache_table(analysis))
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0

def _cmd_lecture(args) -> int:
    from mooncake_gym.course.lecture import run_lecture

    return run_lecture(args)


def _train_wrappers(args) -> list[dict]:
    """``--wrapper MODULE.CLASS[:KWARGS]`` options as the wrapper specs ``train`` takes."""
    from mooncake_gym.agents.train import parse_env_kwargs


    wrappers = []
    for text in args.wrapper or []:
        path, sep, kwargs = text.partition(":")
        wrappers.append({"class": path, "kwargs": parse_env_kwargs(kwargs) if sep else {}})
    return wrappers


def _cmd_train(args) -> int:
    if args.backend == "rllib":
        return _train_rllib(args)
    from mooncake_gym.agents.train import parse_env_kwargs, train

    wrappers = _train_wrappers(args)
    path = train(args.env, timesteps=args.timesteps, seed=args.seed, out=args.out, tensorboard=args.tensorboard,
                 progress_bar=not args.no_progress, threads=args.threads, algo=args.algo,
                 env_kwargs=parse_env_kwargs(args.env_kwargs), n_envs=args.n_envs, vecnormalize=args.vecnormalize,
                 wrappers=wrappers, vec_env=args.vec_env, evaluate_card=not args.no_evaluate)
    print(f"best model: {path}\ncard: {path.with_suffix('.json')}")
    return 0


def _train_rllib(args) -> int:
    """``train --backend rllib``: RLlib PPO, one line per iteration (docs/scale-out.md)."""
    from mooncake_gym.agents.rllib import train_rllib

    def show(r):
        extra = "  ".join(f"{k} {v:.4g}" for k, v in r.items() if k not in ("iteration", "timesteps"))
        print(f"iteration {r['iteration']:3d}  env steps {r['timesteps']:8d}  {extra}", flush=True)

    train_rllib(args.env, 10 if args.iterations is None else args.iterations,
                num_env_runners=args.num_env_runners or 0, address=args.address,
                seed=args.seed, out=args.out, progress=show, threads=args.threads)
    print(f"RLlib checkpoint: {args.out}")
    return 0


def _cmd_tune(args) -> int:
    """``mooncake-gym tune``: a baseline's knobs, or PPO's hyperparameters (Ray), on training seeds."""
    from mooncake_gym.experiments import tune

    if (args.policy is None) == (args.algo is None):
        raise ValueError("tune: give exactly one of --policy NAME (a baseline's knobs) or --algo ppo")
    if args.address and args.backend == "local":
        raise ValueError("--address: for --backend ray only")
    show = None if args.json else (lambda r: print(f"  {r['knobs']}: {r['score']:.4f}", file=sys.stderr, flush=True))
    if args.algo is not None:
        if args.backend != "ray":
            raise ValueError("--algo ppo: PPO sweeps run on Ray Tune; add --backend ray")
        overrides = {} if args.train_batch is None else {"train_batch_size_per_learner": args.train_batch}
        env_kwargs = {} if args.episode_requests is None else {"episode_requests": args.episode_requests}
        doc = tune.tune_ppo(args.env, budget=args.budget, search=args.search, iterations=args.iterations,
                            num_env_runners=args.num_env_runners, address=args.address, seed=args.seed,
                            env_kwargs=env_kwargs, overrides=overrides)
    else:
        trace = None
        if args.trace and args.scenario:
            trace = args.trace  # the scenario's required trace, by path (its fingerprint hashes the file)
        elif args.trace:
            from mooncake_gym.model.workload import read_trace

            trace = read_trace(args.trace)
            print("note: a replayed trace is the same workload whatever the seed; for a held-out result, "
                  "compare on another trace than the one tuned on", file=sys.stderr)
        doc = tune.tune_baseline(args.policy, args.env, budget=args.budget, search=args.search, seeds=args.seeds,
                                 rates=args.rates, loads=args.loads, trace=trace, speed=args.speed,
                                 episode_requests=(tune.TUNE_EPISODE_REQUESTS if args.episode_requests is None
                                                   else args.episode_requests),
                                 backend=args.backend,
                                 address=args.address, seed=args.seed, metric=args.metric, progress=show,
                                 scenario=args.scenario)
    tune.write_result(doc, args.out)
    if args.json:
        report.print_json(doc)
        return 0
    what = doc.get("policy") or doc["algo"]
    print(f"{what} on {doc['env']}: {len(doc['results'])} settings, {doc['metric']} ({doc['goal']})"
          + (f", training seeds {doc['seeds'][0]}..{doc['seeds'][-1]}" if "seeds" in doc else ""))
    print(tune.format_results(doc))
    print(f"best: {doc['knobs']} ({doc['metric']} {doc['score']:.4f}); written to {args.out}")
    return 0


def _cmd_compare_scenarios(args, agents, tuned) -> int:
    """``compare --scenario NAME[,NAME...]|all``: one ranked table per scenario, its fingerprint above it."""
    from mooncake_gym.experiments import compare as cmp

    names = "all" if args.scenario == "all" else [n.strip() for n in args.scenario.split(",") if n.strip()]
    settings, skipped = cmp.compare_scenarios(names, seeds=args.seeds, trace=args.trace, agents=agents, tuned=tuned,
                                              progress=not (args.json or args.no_progress), threads=args.threads)
    if args.json:
        doc = cmp.settings_json(settings, args.seeds)
        for s, out in zip(settings, doc["settings"]):
            out.update({"scenario": s.scenario, "fingerprint": s.fingerprint})
        doc["skipped"] = skipped
        report.print_json(doc)
        return 0
    seeds = [cmp.COMPARE_SEED_BASE + i for i in range(args.seeds)]
    print(f"Mean ± 95% CI over {args.seeds} held-out seed{'s' if args.seeds > 1 else ''} "
          f"({seeds[0]}..{seeds[-1]}), same workloads for every policy; ranked by the problem's main metric.")
    for path, doc in zip(args.tuned or [], tuned or []):
        print(f"{doc['policy']} (tuned{' on ' + doc['scenario'] if doc.get('scenario') else ''}): {doc['knobs']} from {path}")
    for s in settings:
        print(f"\n{'### ' if args.markdown else ''}{s.label}\n")
        print(f"fingerprint: {'`' if args.markdown else ''}{s.fingerprint}{'`' if args.markdown else ''}\n")
        print(cmp.format_setting(cmp.ranked(s), markdown=args.markdown))
    for reason in skipped:
        print(f"\n{reason}")
    return 0


def _cmd_compare(args) -> int:
    from mooncake_gym.experiments import compare as cmp

    if args.preset != "lecture":  # the v1 environments of a realistic preset (mooncake_gym.experiments.clusterrun)
        from mooncake_gym.experiments.clusterrun import cmd_compare
        return cmd_compare(args)
    agents = None
    if args.agent:
        from mooncake_gym.agents import load_agent

        model = load_agent(args.agent, trusted=args.unsafe_pickle)
        if model.source == "pickle":
            print(f"note: {args.agent} was unpickled (--unsafe-pickle): loading it could run code", file=sys.stderr)
        problem = args.agent_env or cmp.problem_of(model)
        if args.env not in ("all", problem) and not args.scenario:
            raise ValueError(f"--agent: the agent solves {problem}, but --env is {args.env}")
        agents = {**cmp.shipped_agents(), "user_agent": (problem, model)}
    tuned = None
    if args.tuned:
        from mooncake_gym.experiments.tune import read_tuned

        tuned = [read_tuned(path) for path in args.tuned]
        for path, doc in zip(args.tuned, tuned):
            if args.env not in ("all", doc["env"]):
                raise ValueError(f"--tuned {path}: tuned for {doc['env']}, but --env is {args.env}")
    if args.scenario:
        return _cmd_compare_scenarios(args, agents, tuned)
    trace = None
    if args.trace:
        from mooncake_gym.model.workload import read_trace

        trace = read_trace(args.trace)
    settings = cmp.compare(env=args.env, seeds=args.seeds, rates=args.rates, loads=args.loads, trace=trace,
                           speed=args.speed, agents=agents, plot_dir=args.plot_dir,
                           progress=not (args.json or args.no_progress), threads=args.threads, tuned=tuned)
    if args.json:
        report.print_json(cmp.settings_json(settings, args.seeds))
        return 0
    seeds = [cmp.COMPARE_SEED_BASE + i for i in range(args.seeds)]
    if args.seeds == 1:
        print(f"One held-out seed ({seeds[0]}), same workload for every policy: no confidence interval.")
    else:
        print(f"Mean ± 95% CI over {args.seeds} held-out seeds ({seeds[0]}..{seeds[-1]}), "
              "same workloads for every policy.")
    for path, doc in zip(args.tuned or [], tuned or []):
        print(f"{doc['policy']} (tuned): {doc['knobs']} from {path}")
    for s in settings:
        print(f"\n{'### ' if args.markdown else ''}{s.label}\n")
        print(cmp.format_setting(s, markdown=args.markdown))
    if args.plot_dir:
        print(f"\nplots written to {args.plot_dir}")
    return 0


def _add_preset_arg(p: argparse.ArgumentParser, realistic: str) -> None:
    from mooncake_gym.experiments.clusterrun import PRESET_NAMES

    p.add_argument("--preset", choices=PRESET_NAMES, default="lecture",
                   help=f"cluster preset (mooncake_gym.model.presets): lecture (default) is the lecture's toy, as without "
                        f"this option; with {', '.join(n for n in PRESET_NAMES if n != 'lecture')}, {realistic}")


def _cmd_bench(args) -> int:
    from mooncake_gym.cli.bench import run_benchmarks

    results = run_benchmarks(seconds=args.seconds, only=args.only)
    if args.json:
        report.print_json(results)
    return 0


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line of stderr (exit code 2, as argparse's own)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: Numeric options and the range of ``mooncake_gym.model.limits`` each is checked against (lists: each item).
_OPTION_LIMITS = {"rate": "rate", "seed": "seed", "duration": "duration_s", "requests": "requests",
                  "instances": "n_instances", "cache_blocks": "cache_blocks", "ttft_slo": "ttft_slo_s",
                  "speed": "speed", "threshold": "threshold", "load": "load", "timesteps": "timesteps",
                  "threads": "threads", "seeds": "seeds", "seconds": "seconds", "rates": "rate", "loads": "load",
                  "n_envs": "n_envs", "prefill_instances": "n_prefill", "decode_instances": "n_decode"}
#: Options that only apply to a synthetic trace (per command), and their defaults (overload's rate:
#: ``overload.DEMO3_BASE_RATE``, filled in ``check_args``).
_SYNTHETIC_ONLY = {"trace stats": {"rate": 4.0, "seed": 0}, "cache": {"rate": 4.0, "seed": 0},
                   "replay": {"rate": 4.0}, "overload": {"rate": None}}


#: train's options of one backend, and their defaults (given with the other backend: no effect).
_SB3_ONLY = {"timesteps": None, "tensorboard": None, "algo": "ppo", "env_kwargs": None, "n_envs": None,
             "vec_env": "auto", "vecnormalize": False, "wrapper": None, "no_evaluate": False, "no_progress": False}
_RLLIB_ONLY = ("iterations", "num_env_runners", "address")
#: tune's options of a baseline search (--policy) and of a PPO sweep (--algo), with their defaults.
_TUNE_POLICY_ONLY = {"seeds": 3, "rates": [4.0, 8.0], "loads": [2.0], "trace": None, "speed": 1.0, "metric": None}
_TUNE_PPO_ONLY = {"iterations": 10, "num_env_runners": 0, "train_batch": None}


def _check_tune_args(args) -> None:
    """``tune``: the options of the other kind of search, and workload options for the other
    problem, have no effect; fills the defaults of those left out."""
    own, other = (_TUNE_PPO_ONLY, _TUNE_POLICY_ONLY) if args.algo is not None else (_TUNE_POLICY_ONLY, _TUNE_PPO_ONLY)
    kind = "--algo" if args.algo is not None else "--policy"
    for dest in other:
        if getattr(args, dest) is not None:
            raise _no_effect(dest, f"with {kind}: it is an option of {'--policy' if kind == '--algo' else '--algo'}")
    if args.algo is None:
        if args.rates is not None and (args.env == "admission" or args.trace):
            raise _no_effect("rates", "with --env admission or --trace: it sets the synthetic routing workloads")
        if args.loads is not None and args.env == "routing":
            raise _no_effect("loads", "with --env routing: it sets the admission workloads")
        if args.speed is not None and not args.trace:
            raise _no_effect("speed", "without --trace: it is the replay speed of a trace")
    if args.scenario is not None:
        from mooncake_gym.evaluation.scenarios import get_scenario

        if args.algo is not None:
            raise _no_effect("scenario", "with --algo: PPO sweeps run on the problem's environment")
        get_scenario(args.scenario)  # an unknown name is named before any work
        for dest in ("rates", "loads", "speed", "episode_requests"):
            if getattr(args, dest) is not None:
                raise _no_effect(dest, "with --scenario: the scenario fixes its workload (docs/scenarios.md)")
    for dest, default in own.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _no_effect(dest: str, why: str) -> ValueError:
    return ValueError(f"{_option(dest)}: has no effect {why}; leave it out")


def check_args(args) -> None:
    """Every argument checked before any work starts: numbers in their ranges (``mooncake_gym.model.limits``),
    plot paths writable, and no argument that would have no effect. Fills the defaults of the
    options whose presence matters. ``ValueError`` naming the option otherwise."""
    from mooncake_gym.model.limits import check
    from mooncake_gym.sim.admission import DEMO3_BASE_RATE

    for dest, kind in _OPTION_LIMITS.items():
        value = getattr(args, dest, None)
        for v in (value if isinstance(value, list) else [value]):
            if v is not None:
                check(kind, v, _option(dest))
    command = args.command + (f" {args.trace_command}" if args.command == "trace" else "")
    synthetic_only = _SYNTHETIC_ONLY.get(command, {})
    for dest, default in synthetic_only.items():
        if getattr(args, dest) is None:
            setattr(args, dest, DEMO3_BASE_RATE if default is None else default)
        elif args.trace != "synthetic":
            raise _no_effect(dest, f"with a trace file ({args.trace}): it sets up the synthetic trace")
    if getattr(args, "seed", 0) is None:  # replay: the seed also drives the random baseline's tie-breaks
        args.seed = 0
    if command == "replay" and args.threshold is not None and args.policy not in ("kvcentric", "all"):
        raise _no_effect("threshold", f"with --policy {args.policy}: it is kvcentric's")
    if command == "replay":
        from mooncake_gym.sim.observation import as_observation
        from mooncake_gym.sim.routing import parse_instances

        if args.json and args.markdown:
            raise _no_effect("markdown", "with --json: --json prints one JSON document")
        if args.pool is not None:
            n = len(parse_instances(args.pool))
            if args.instances is not None and args.instances != n:
                raise ValueError(f"--instances: expected {n} (the length of --pool {args.pool}) or leave it out, "
                                 f"got {args.instances}")
        for mode in args.observation or ():
            try:
                as_observation(mode)  # a bad mode or setting is named before the trace is read
            except ValueError as e:
                raise ValueError(f"--observation {mode}: {e}") from None
        if args.tuned and args.preset == "lecture":
            from mooncake_gym.experiments.tune import read_tuned

            args.tuned_docs = [read_tuned(path) for path in args.tuned]
            for path, doc in zip(args.tuned, args.tuned_docs):
                if doc["env"] != "routing":
                    raise ValueError(f"--tuned {path}: tuned for {doc['env']}, but replay routes")
    if command == "train":
        if args.backend == "rllib":
            for dest, default in _SB3_ONLY.items():
                if getattr(args, dest) != default:
                    why = "; with --backend rllib give --iterations" if dest == "timesteps" else \
                        " (RLlib's results are in its checkpoint folder)" if dest == "tensorboard" else ""
                    raise ValueError(f"{_option(dest)}: stable-baselines3 only (--backend sb3){why}")
        else:
            for dest in _RLLIB_ONLY:
                if getattr(args, dest) is not None:
                    raise ValueError(f"{_option(dest)}: for --backend rllib only")
            from mooncake_gym.agents.train import parse_env_kwargs

            parse_env_kwargs(args.env_kwargs)  # a malformed --env-kwargs or --wrapper names itself before training
            _train_wrappers(args)
    if command == "tune":
        _check_tune_args(args)
    if command == "lecture" and args.plot is not None and args.demo not in (None, 3):
        raise _no_effect("plot", f"with --demo {args.demo}: only demo 3 draws a figure")
    if command == "compare" and args.scenario:
        from mooncake_gym.evaluation.scenarios import get_scenario

        if args.scenario != "all":
            for name in args.scenario.split(","):
                get_scenario(name.strip())  # an unknown name is named before any work
        for dest in ("speed", "rates", "loads", "plot_dir"):
            if getattr(args, dest) is not None:
                raise _no_effect(dest, "with --scenario: a scenario fixes its workload (docs/scenarios.md)")
        if args.env != "all":
            raise _no_effect("env", "with --scenario: each scenario names its problem")
        if args.preset != "lecture":
            raise _no_effect("preset", "with --scenario: each scenario names its cluster")
    if command in ("replay", "overload", "compare"):
        from mooncake_gym.experiments.clusterrun import check_preset_args

        check_preset_args(command, args)  # --preset's own checks; fills the lecture's defaults
    if command == "compare":
        if args.speed is not None and not args.trace:
            raise _no_effect("speed", "without --trace: it is the replay speed of a trace")
        if args.agent_env is not None and not args.agent:
            raise _no_effect("agent_env", "without --agent")
        if args.rates is not None and (args.env == "admission" or args.trace):
            raise _no_effect("rates", "with --env admission or --trace: it sets the synthetic routing workloads")
        if args.loads is not None and args.env == "routing":
            raise _no_effect("loads", "with --env routing: it sets the admission workloads")
        if args.unsafe_pickle and not args.agent:
            raise _no_effect("unsafe_pickle", "without --agent: the shipped agents load without unpickling")
        if args.json and args.no_progress:
            raise _no_effect("no_progress", "with --json: --json never shows a progress bar")
        args.speed = 1.0 if args.speed is None else args.speed
        args.rates = [4.0, 8.0] if args.rates is None else args.rates
        args.loads = [2.0] if args.loads is None else args.loads
    if getattr(args, "plot", None) is not None:
        from mooncake_gym.reporting.plots import check_plot_path

        check_plot_path(args.plot, "--plot")
    if getattr(args, "plot_dir", None) is not None:
        from mooncake_gym.reporting.plots import check_plot_dir

        check_plot_dir(args.plot_dir, "--plot-dir")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mooncake-gym", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # --- trace -------------------------------------------------------------------------------
    p_trace = sub.add_parser("trace", help="inspect or generate workload traces")
    trace_sub = p_trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    p = trace_sub.add_parser("stats", help="statistics of a trace")
    _add_trace_args(p, positional=True)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_trace_stats)
    p = trace_sub.add_parser("generate", help="write a synthetic trace as JSONL")
    p.add_argument("--rate", type=float, default=4.0, help="session arrivals per second (default 4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of session arrivals (default 600)")
    p.add_argument("--requests", type=int, default=None, help="cut to the first N requests")
    p.add_argument("-o", "--output", required=True, help="output JSONL file")
    p.set_defaults(func=_cmd_trace_generate)

    # --- lecture -----------------------------------------------------------------------------
    p = sub.add_parser("lecture", help="reproduce the lecture's demos (all that exist by default)")
    p.add_argument("--demo", type=int, choices=[1, 2, 3], default=None, help="run only this demo")
    p.add_argument("--plot", default=None, help="demo 3: write the load-series figure to this PNG file")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_lecture)

    # --- replay (routing) ----------------------------------------------------------------------
    from mooncake_gym.baselines import ROUTING_POLICIES

    p = sub.add_parser("replay", help="replay a trace through the prefill-routing simulator")
    _add_trace_args(p)
    p.add_argument("--policy", default="all", choices=[*ROUTING_POLICIES, "all"],
                   help="routing baseline, or 'all' for one table of every baseline (default all)")
    p.add_argument("--instances", type=int, default=None,
                   help="prefill instances (default 8, or --pool's or the --preset's)")
    p.add_argument("--decode-instances", type=int, default=None,
                   help="cluster presets: decode instances (default the --preset's)")
    p.add_argument("--pool", default=None, metavar="4xH800+4xA800",
                   help="a heterogeneous pool: COUNTxGPU joined by '+' (GPUs: A100, A800, H100, H800)")
    p.add_argument("--observation", action="append", default=None, metavar="MODE[,FIELD=VALUE...]",
                   help="what the router sees: exact (default), or scraped, approximate|precise, noisy joined by "
                        "'+', with ObservationConfig fields, e.g. 'scraped+noisy,scrape_delay_s=0.5'; repeat it "
                        "for one table of every mode (JSON: results keyed by mode)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--cache-blocks", type=int, default=None,
                   help="local prefix-cache blocks per instance (default 3000, or the --preset's)")
    p.add_argument("--ttft-slo", type=float, default=None, help="TTFT SLO in seconds (default 5, or the --preset's)")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed-up: 2 = arrivals twice as fast (default 1)")
    p.add_argument("--threshold", type=float, default=None, help="kvcentric's kvcache_balancing_threshold")
    p.add_argument("--tuned", action="append", default=None, metavar="FILE",
                   help="also run the baseline of this `mooncake-gym tune --env routing` result with its tuned knobs, "
                        "as 'NAME (tuned)' (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    _add_preset_arg(p, "the routing baselines own the prefill decision of the whole cluster "
                       "(conductor.simulate; TTFT and TBT)")
    p.set_defaults(func=_cmd_replay)
    # --- overload (admission) ------------------------------------------------------------------
    from mooncake_gym.baselines import ADMISSION_POLICIES
    from mooncake_gym.sim.admission import DEMO3_BASE_RATE, DEMO3_LOAD, DEMO3_REQUESTS, OverloadConfig

    p = sub.add_parser("overload", help="admission baselines under overload (Mooncake §7, lecture demo 3)")
    p.add_argument("--policy", default="all", choices=[*ADMISSION_POLICIES, "all"],
                   help="admission baseline, or 'all' for one table of every baseline (default all)")
    p.add_argument("--trace", default="synthetic",
                   help="base trace: a Mooncake JSONL file, or 'synthetic' (default); requests are drawn from it i.i.d.")
    p.add_argument("--rate", type=float, default=None,
                   help=f"synthetic base trace: session arrivals per second (default {DEMO3_BASE_RATE:g})")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic base trace and of the i.i.d. draw (default 0)")
    p.add_argument("--requests", type=int, default=DEMO3_REQUESTS, help=f"requests drawn (default {DEMO3_REQUESTS:,})")
    p.add_argument("--load", type=float, default=DEMO3_LOAD,
                   help=f"arrival rate as a multiple of the decode pool's capacity (default {DEMO3_LOAD:g})")
    p.add_argument("--ttft-slo", type=float, default=None, help="TTFT SLO in seconds (default 30, or the --preset's)")
    p.add_argument("--prefill-instances", type=int, default=None,
                   help="prefill instances (default 8, or the --preset's)")
    p.add_argument("--decode-instances", type=int, default=None, help="decode instances (default 8, or the --preset's)")
    p.add_argument("--plot", default=None, help="write the load series of the policies run to this PNG file")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--fresh-blocks", action="store_true",
                   help="cluster presets: each re-drawn copy of a base request gets fresh ids for the blocks it "
                        "brought into the base trace, so a long draw reuses only what each request reused there")
    p.add_argument("--tbt-headroom", type=float, default=None,
                   help="cluster presets: the share of the TBT SLO the decode instances' admission check keeps "
                        "free, in [0, 1) (default 0: a request joins if the next iteration fits the SLO)")
    _add_preset_arg(p, "the admission baselines own the admission decision of the whole cluster, --load "
                       "being a multiple of its measured saturation throughput")
    p.set_defaults(func=_cmd_overload)

    # --- cache (hit rate versus capacity) -----------------------------------------------------
    from mooncake_gym.analysis.cache import DEFAULT_BLOCKS, DEFAULT_MODEL, POLICIES, WINDOWS

    p = sub.add_parser("cache", help="hit rate versus capacity of one global cache (LRU, FIFO, optimal)")
    p.add_argument("trace", help="a Mooncake JSONL trace file, or 'synthetic'")
    p.add_argument("--rate", type=float, default=None, help="synthetic trace: session arrivals per second (default 4)")
    p.add_argument("--seed", type=int, default=None, help="synthetic trace: random seed (default 0)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--blocks", default=None,
                     help=f"comma-separated capacities in blocks (default {','.join(map(str, DEFAULT_BLOCKS))})")
    cap.add_argument("--gib", default=None, help="comma-separated capacities in GiB of --model's KV")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"model preset for GiB figures (default {DEFAULT_MODEL}; 320 KiB of KV per token)")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated subset of lru,fifo,optimal (default all)")
    p.add_argument("--window", choices=WINDOWS, default="all",
                   help="measure all requests (default), or warm on the first half and measure the second "
                        "(kvcache-simulator's convention)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="write hit rate versus capacity to this PNG file")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_cache)

    # --- train / compare / bench ----------------------------------------------------------------
    p = sub.add_parser("train", help="train an agent (stable-baselines3 / sb3-contrib) on one environment")
    p.add_argument("--env", choices=["routing", "admission"], required=True, help="which problem")
    p.add_argument("--algo", choices=["ppo", "a2c", "dqn", "recurrentppo", "maskableppo"], default="ppo",
                   help="algorithm (default ppo; recurrentppo and maskableppo need pip install 'mooncake-gym[contrib]')")
    p.add_argument("--env-kwargs", default=None,
                   help="env kwargs on top of the recipe's, as JSON or key=value,...: e.g. rate=8 or n_instances=4")
    p.add_argument("--n-envs", type=int, default=None, help="parallel training envs (default: agents/hyperparams.yml)")
    p.add_argument("--vec-env", choices=["auto", "dummy", "subproc"], default="auto",
                   help="run the envs in this process (dummy) or in subprocesses; auto: subprocesses only where "
                        "a step is slow enough for them to pay (default auto)")
    p.add_argument("--vecnormalize", action="store_true",
                   help="normalise observations with VecNormalize (its statistics are saved in the card)")
    p.add_argument("--wrapper", action="append", default=None, metavar="MODULE.CLASS[:KWARGS]",
                   help="observation wrapper around every env (repeatable, innermost first; kwargs as for --env-kwargs)")
    p.add_argument("--timesteps", type=int, default=None, help="total timesteps (default: agents/hyperparams.yml)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    p.add_argument("--out", default="runs/train", help="output directory (default runs/train)")
    p.add_argument("--tensorboard", default=None, help="TensorBoard log directory")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-evaluate", action="store_true",
                   help="skip the card's held-out evaluation next to the baselines (about 20 s)")
    p.add_argument("--backend", choices=["sb3", "rllib"], default="sb3",
                   help="stable-baselines3 (default) or Ray RLlib PPO (needs the ray extra; docs/scale-out.md)")
    p.add_argument("--iterations", type=int, default=None, help="rllib: training iterations (default 10)")
    p.add_argument("--num-env-runners", type=int, default=None, help="rllib: remote env runners (default 0: sample in the driver)")
    p.add_argument("--address", default=None, help="rllib: address of a running Ray cluster (default: start Ray locally)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("compare", help="every baseline and trained agent on the same workloads (the main job)")
    p.add_argument("--env", choices=["routing", "admission", "all"], default="all", help="which problem (default all)")
    p.add_argument("--seeds", type=int, default=5, help="held-out seeds per setting (default 5)")
    p.add_argument("--rates", type=_floats, default=None, help="routing session rates (default 4,8)")
    p.add_argument("--loads", type=_floats, default=None, help="admission loads, x decode capacity (default 2)")
    p.add_argument("--trace", default=None, help="compare on this JSONL trace (routing: replayed; admission: base)")
    p.add_argument("--speed", type=float, default=None, help="replay speed of --trace (default 1)")
    p.add_argument("--agent", default=None,
                   help="also evaluate this agent of your own (a zip with its JSON card; loaded without unpickling)")
    p.add_argument("--unsafe-pickle", action="store_true",
                   help="allow --agent without a card (unpickled by SB3's load) and let its card's wrapper modules be "
                        "imported: BOTH CAN RUN CODE (trusted files only)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the agents' forward passes (default 1)")
    p.add_argument("--agent-env", choices=["routing", "admission"], default=None,
                   help="the problem --agent solves (default: found from its observation and action spaces)")
    p.add_argument("--plot-dir", default=None, help="write TTFT box plots and CDFs and admission load series here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--tuned", action="append", default=None, metavar="FILE",
                   help="also run the baseline of this `mooncake-gym tune` result with its tuned knobs (repeatable)")
    p.add_argument("--scenario", default=None, metavar="NAME[,NAME...]|all",
                   help="compare on named benchmark scenarios instead (docs/scenarios.md); --trace gives the trace of "
                        "those that need one, the others are skipped with the reason")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON document")
    fmt.add_argument("--markdown", action="store_true", help="print Markdown tables")
    _add_preset_arg(p, "the baselines on mooncake_gym/PrefillRouting-v1 and OverloadAdmission-v1, "
                       "--loads applying to both problems")
    p.set_defaults(func=_cmd_compare)

    from mooncake_gym.experiments.tune import BACKENDS, MAX_TUNE_SEEDS, SEARCHES, TUNE_EPISODE_REQUESTS

    p = sub.add_parser("tune", help="search a baseline's knobs (or PPO's hyperparameters with Ray) on training seeds")
    p.add_argument("--policy", default=None, help="the baseline whose KNOBS to search, e.g. kvcentric")
    p.add_argument("--algo", choices=["ppo"], default=None, help="sweep RLlib PPO's hyperparameters instead (--backend ray)")
    p.add_argument("--env", choices=["routing", "admission"], required=True, help="which problem")
    p.add_argument("--budget", type=int, default=None,
                   help="settings to try (grid: at least the grid's size; random: how many to draw; default all)")
    p.add_argument("--search", choices=SEARCHES, default="grid", help="grid (default) or random")
    p.add_argument("--backend", choices=BACKENDS, default="local", help="local loop (default) or Ray Tune")
    p.add_argument("--address", default=None, help="ray: address of a running Ray cluster (default: start Ray locally)")
    p.add_argument("--seeds", type=int, default=None, help=f"training seeds per workload (default 3, at most {MAX_TUNE_SEEDS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random search's draw and of PPO (default 0)")
    p.add_argument("--rates", type=_floats, default=None, help="routing session rates (default 4,8)")
    p.add_argument("--loads", type=_floats, default=None, help="admission loads, x decode capacity (default 2)")
    p.add_argument("--trace", default=None, help="tune on this JSONL trace (routing: replayed; admission: base)")
    p.add_argument("--speed", type=float, default=None, help="replay speed of --trace (default 1)")
    p.add_argument("--episode-requests", type=int, default=None,
                   help=f"requests per synthetic episode (default {TUNE_EPISODE_REQUESTS}; ppo: hyperparams.yml's)")
    p.add_argument("--metric", default=None,
                   help="the metric to optimise (default: routing mean_ttft_s, admission goodput; see mooncake_gym.experiments.tune)")
    p.add_argument("--iterations", type=int, default=None, help="ppo: RLlib iterations per trial (default 10)")
    p.add_argument("--num-env-runners", type=int, default=None, help="ppo: remote env runners per trial (default 0)")
    p.add_argument("--train-batch", type=int, default=None, help="ppo: env steps per iteration (default: hyperparams.yml)")
    p.add_argument("--scenario", default=None, metavar="NAME",
                   help="tune on this scenario's environment (docs/scenarios.md; --trace gives its trace if it needs one)")
    p.add_argument("--out", required=True, metavar="FILE.json", help="write the result (best knobs) here")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_tune)

    p = sub.add_parser("bench", help="speed benchmarks (decisions/s, env steps/s next to CartPole)")
    p.add_argument("--seconds", type=float, default=2.0, help="time budget per measurement (default 2)")
    p.add_argument("--only", default=None, help="run only benchmarks whose name contains this")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # bad input or path: a clear one-line error, no traceback
        print(f"mooncake-gym {args.command}: error: {e}", file=sys.stderr)
        return 2

