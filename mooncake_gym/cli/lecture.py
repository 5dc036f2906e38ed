"""``mooncake-gym lecture``: reproduce the lecture's demos."""

from __future__ import annotations

from mooncake_gym.cli.options import JSON, Command, NoEffect, opt
from mooncake_gym.course.lecture import run_lecture

COMMAND = Command("lecture", "reproduce the lecture's demos (all that exist by default)", (
    opt("--demo", type=int, choices=[1, 2, 3], default=None, help="run only this demo"),
    opt("--plot", default=None, help="demo 3: write the load-series figure to this PNG file"),
    JSON,
), run_lecture, rules=(NoEffect(("plot",), lambda a: a.demo not in (None, 3),
                                lambda a: f"with --demo {a.demo}: only demo 3 draws a figure"),))
