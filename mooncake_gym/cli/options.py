"""The command line's shared parts: a command's options declared once (:class:`Opt`), the options
that have no effect in a context (:class:`NoEffect`), and :class:`Command`, which builds its parser
and checks its arguments from them before any work."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from mooncake_gym._files import check_output_file
from mooncake_gym.model.limits import check
from mooncake_gym.model.presets import PRESETS, get_preset
from mooncake_gym.model.traceformats import TraceFormat, parse_format
from mooncake_gym.reporting.requests import SUFFIXES as PER_REQUEST_SUFFIXES
from mooncake_gym.sim.policy import is_policy_spec, load_policy

_UNSET = object()


@dataclass(frozen=True)
class Opt:
    """One option: argparse's ``flags`` and keywords, the range of ``mooncake_gym.model.limits`` its
    value (each item of a list) is checked against, its mutually exclusive ``group``, ``synthetic``:
    its default when it only sets up a synthetic trace (given with a trace file: no effect), and
    ``only``: ``(decode model, why)`` when it applies to the presets of one decode model only, and
    ``output``: the file name endings of a file it names to be written (``()``: any), checked
    writable before any work (``mooncake_gym._files.check_output_file``)."""

    flags: tuple
    kwargs: dict
    limit: str | None = None
    group: str | None = None
    synthetic: object = _UNSET
    only: tuple | None = None
    output: tuple | None = None

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest") or self.flags[-1].lstrip("-").replace("-", "_")


def opt(*flags, limit=None, group=None, synthetic=_UNSET, only=None, output=None, **kwargs) -> Opt:
    return Opt(flags, kwargs, limit, group, synthetic, only, output)


@dataclass(frozen=True)
class NoEffect:
    """The options ``dests`` have no effect while ``when(args)`` holds: given, they are an error
    ``--OPTION: has no effect WHY; leave it out`` (``why`` may be a function of ``args``)."""

    dests: tuple
    when: Callable
    why: str | Callable


def option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def no_effect(dest: str, why: str) -> ValueError:
    return ValueError(f"{option(dest)}: has no effect {why}; leave it out")


def given(value) -> bool:
    return value is not None and value is not False


def floats(text: str) -> list[float]:
    """``--rates``/``--loads``: comma-separated positive numbers."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def policy_opt(registry, what: str) -> Opt:
    """``--policy``: a baseline of ``registry``, ``all``, or a user's policy ``FILE.py:NAME`` /
    ``MODULE:NAME`` (``mooncake_gym.sim.policy.load_policy``; imported by the command's check)."""
    def policy(text: str) -> str:
        if text == "all" or text in registry or is_policy_spec(text):
            return text
        raise argparse.ArgumentTypeError(f"expected one of {[*registry, 'all']} or FILE.py:NAME / MODULE:NAME "
                                         f"(your own {what} policy), got {text!r}")
    return opt("--policy", default="all", type=policy, metavar="NAME|all|FILE.py:NAME",
               help=f"{what} baseline, 'all' for one table of every baseline (default all), or your own {what} "
                    f"policy: a function view -> action in FILE.py or MODULE (docs/examples/my_router.py)")


def check_policy(args) -> None:
    """A user's ``--policy FILE.py:NAME`` imported before any work (its errors named in one line)."""
    if is_policy_spec(args.policy):
        load_policy(args.policy)


#: ``--trace-format``: how a trace file is read (``mooncake_gym.model.traceformats``)
TRACE_FORMAT = opt("--trace-format", type=str, default=None, metavar="FORMAT",
                   help="the --trace file's format: mooncake (JSONL, the default), azure, burstgpt, or "
                        "csv:timestamp=COL,input=COL,output=COL[,session=COL][,unit=s|ms|datetime]; a source "
                        "without prefix ids gets them per session where it names sessions, else none")


def trace_format(args) -> TraceFormat:
    """``--trace-format`` parsed (the default: Mooncake's JSONL)."""
    return parse_format(args.trace_format or "mooncake")


def trace_opts(positional: bool = False, rate=4.0, seed=0) -> tuple:
    """A trace file or 'synthetic', its format, and the synthetic trace's rate and seed
    (``seed=None``: the seed also serves other randomness, so a trace file does not make it idle)."""
    trace = opt("trace", help="a trace file (see --trace-format), or 'synthetic'") if positional else \
        opt("--trace", default="synthetic", help="a trace file (see --trace-format), or 'synthetic' (default)")
    return (trace, TRACE_FORMAT,
            opt("--rate", type=float, default=None, limit="rate", synthetic=rate,
                help="synthetic trace: session arrivals per second (default 4)"),
            opt("--seed", type=int, default=None, limit="seed", synthetic=_UNSET if seed is None else seed,
                help="synthetic trace: random seed (default 0)"))


#: ``--preset``'s default: Mooncake's testbed, the faithful cluster (``--preset lecture``: the lecture's toy)
PRESET_DEFAULT = "mooncake"


def preset_opt(realistic: str) -> Opt:
    others = ", ".join(n for n in PRESETS if n != "lecture")
    return opt("--preset", choices=tuple(PRESETS), default=PRESET_DEFAULT,
               help=f"cluster preset (mooncake_gym.model.presets): with {others} ({PRESET_DEFAULT}, Mooncake's "
                    f"testbed, by default), {realistic}; lecture is the lecture's toy (its simulators and the v0 "
                    f"environments)")


#: ``--per-request``, ``--plot-dir``, ``--timeline``: one run's requests (``mooncake_gym.reporting.requests``)
RUN_OUTPUTS = (
    opt("--per-request", default=None, metavar="FILE.csv|FILE.jsonl", output=PER_REQUEST_SUFFIXES,
        help="write one row per request (arrival, prefill instance, hit and computed tokens, queue wait, TTFT, "
             "decode instance, mean and tail TBT, outcome; policy when several run), CSV or JSONL by the suffix"),
    opt("--plot-dir", default=None, metavar="DIR",
        help="write TTFT and TBT CDFs (a colour and marker per policy) and SLO attainment and goodput per policy here"),
    opt("--timeline", default=None, metavar="FILE.json", output=(".json",),
        help="write the instances' timeline in Chrome's trace-event format (open it in Perfetto): a slice per "
             "prefill and per decode residency, a process per pool, a thread per instance"),
)


#: ``--preset-file``: a preset of the user's, as data (``mooncake_gym.model.presets.load_preset_file``; docs/presets.md)
PRESET_FILE = opt("--preset-file", default=None, metavar="FILE.toml",
                  help="a cluster preset of your own instead of --preset: GPUs, models, pools, interconnect, engine "
                       "overhead and SLOs in TOML (docs/presets.md; docs/examples/h200-preset.toml)")


def load_preset_file(args) -> None:
    """``--preset-file``: the file read and checked, its preset in ``args.preset`` (by its name)."""
    from mooncake_gym.model.presets import load_preset_file as load

    if "preset" in getattr(args, "_given_once", ()):
        raise ValueError("--preset-file: give --preset or --preset-file, not both (the file's base = NAME "
                         "starts from a built-in preset)")
    try:
        args.preset = load(args.preset_file).name
    except ValueError as e:
        raise ValueError(f"--preset-file: {e}") from None


JSON = opt("--json", action="store_true", help="print one JSON document")


def decode_model(args) -> str:
    """The decode model of ``--preset`` (``reserve``: the lecture's toy; ``batching``: a cluster)."""
    return get_preset(args.preset).decode_model


class _Once(argparse.Action):
    """Store an option's value (or ``True`` for a flag), refusing it a second time: argparse would
    keep the last of ``--policy a --policy b`` silently (options meant to repeat use ``append``)."""

    def __init__(self, option_strings, dest, flag=False, **kwargs):
        super().__init__(option_strings, dest, nargs=0 if flag else None, **kwargs)
        self.flag = flag

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in seen:
            parser.error(f"{option_string}: given more than once; give it once")
        seen.add(self.dest)
        setattr(namespace, self.dest, True if self.flag else values)


def _once(kwargs: dict) -> dict:
    """argparse keywords with a plain or ``store_true`` option stored by :class:`_Once`."""
    action = kwargs.get("action")
    if action is None:
        return {**kwargs, "action": _Once}
    if action == "store_true":
        return {**{k: v for k, v in kwargs.items() if k != "action"}, "action": _Once, "flag": True, "default": False}
    return kwargs


@dataclass(frozen=True)
class Command:
    """A command: its name (``trace stats`` for a subcommand), help, options, no-effect rules,
    its own checks (``check(args)``, after the declared ones) and its run (``run(args) -> exit code``).
    A command with a ``--preset`` option takes ``--preset-file`` too (:data:`PRESET_FILE`)."""

    name: str
    help: str
    options: tuple
    run: Callable
    check: Callable | None = None
    rules: tuple = ()

    @property
    def all_options(self) -> tuple:
        """The declared options, and ``--preset-file`` beside a ``--preset``."""
        if any(o.dest == "preset" for o in self.options):
            return (*self.options, PRESET_FILE)
        return self.options

    def add_to(self, sub) -> None:
        p = sub.add_parser(self.name.split()[-1], help=self.help)
        groups = {}
        for o in self.all_options:
            if o.group is not None and o.group not in groups:
                groups[o.group] = p.add_mutually_exclusive_group()
            positional = not o.flags[0].startswith("-")
            groups.get(o.group, p).add_argument(*o.flags, **(o.kwargs if positional else _once(o.kwargs)))
        p.set_defaults(func=self.run, spec=self)

    def check_args(self, args) -> None:
        """The declared checks: limits, synthetic-trace options, preset-only options, no-effect
        rules; then the command's own."""
        if given(getattr(args, "preset_file", None)):
            load_preset_file(args)
        for o in self.options:
            value = getattr(args, o.dest)
            if o.limit is not None:
                for v in (value if isinstance(value, list) else [value]):
                    if v is not None:
                        check(o.limit, v, option(o.dest))
            if o.output is not None and value is not None:
                check_output_file(value, o.flags[-1], o.output)
        if given(getattr(args, "trace_format", None)):
            if getattr(args, "trace", None) in (None, "synthetic"):
                raise no_effect("trace_format", "without a trace file: it is the format of the trace")
            try:
                parse_format(args.trace_format)
            except ValueError as e:
                raise ValueError(f"--trace-format: {e}") from None
        for o in self.options:
            if o.synthetic is _UNSET:
                continue
            if getattr(args, o.dest) is None:
                setattr(args, o.dest, o.synthetic)
            elif args.trace != "synthetic":
                raise no_effect(o.dest, f"with a trace file ({args.trace}): it sets up the synthetic trace")
        if getattr(args, "seed", 0) is None:  # replay: the seed also drives the random baseline's tie-breaks
            args.seed = 0
        for rule in self.rules:  # (before the preset's: e.g. --rates has no effect with --scenario on any preset)
            if rule.when(args):
                for dest in rule.dests:
                    if given(getattr(args, dest)):
                        raise no_effect(dest, rule.why(args) if callable(rule.why) else rule.why)
        # a scenario fixes its own environment, so the preset's options do not apply to it
        preset_decides = not getattr(args, "scenario", None)
        for o in self.options:
            if (o.only is not None and preset_decides and given(getattr(args, o.dest))
                    and o.only[0] != decode_model(args)):
                model, why = o.only
                where = (f"not with --preset {args.preset}" if model == "reserve"
                         else "only with a cluster --preset (not lecture)")
                raise ValueError(f"{option(o.dest)}: {where}: {why}")
        if self.check is not None:
            self.check(args)
