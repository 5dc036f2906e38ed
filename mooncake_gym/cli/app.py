"""The ``mooncake-gym`` command line. Every subcommand that prints results takes ``--json``."""

from __future__ import annotations

import argparse
import sys

from mooncake_gym.cli import bench, cache, compare, lecture, overload, replay, sweep, trace, train, tune
from mooncake_gym.reporting.plots import check_plot_dir, check_plot_path

#: The commands in the order ``--help`` lists them; ``trace`` has subcommands (``trace.COMMANDS``).
COMMANDS = (lecture.COMMAND, replay.COMMAND, overload.COMMAND, sweep.COMMAND, cache.COMMAND, train.COMMAND,
            compare.COMMAND, tune.COMMAND, bench.COMMAND)


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line of stderr (exit code 2, as argparse's own)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mooncake-gym", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_trace = sub.add_parser("trace", help=trace.HELP)
    trace_sub = p_trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    for command in trace.COMMANDS:
        command.add_to(trace_sub)
    for command in COMMANDS:
        command.add_to(sub)
    return parser


def check_args(args) -> None:
    """Every argument checked before any work starts: numbers in their ranges (``mooncake_gym.model.limits``),
    plot paths writable, and no argument that would have no effect (each command's declared options,
    rules and checks: :meth:`mooncake_gym.cli.options.Command.check_args`). Fills the defaults of the
    options whose presence matters. ``ValueError`` naming the option otherwise."""
    args.spec.check_args(args)
    if getattr(args, "plot", None) is not None:
        check_plot_path(args.plot, "--plot")
    if getattr(args, "plot_dir", None) is not None:
        check_plot_dir(args.plot_dir, "--plot-dir")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
        return int(args.func(args) or 0)
    except (ValueError, OSError) as e:  # bad input or path: a clear one-line error, no traceback
        print(f"mooncake-gym {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's code for SIGINT; files are written whole or not at all
        print(f"mooncake-gym {args.command}: interrupted", file=sys.stderr)
        return 130
