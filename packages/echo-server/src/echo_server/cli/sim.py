"""``echo-sd sim``: echo-scheduler's simulator (every policy on the same steps).

``echo-sd sim --traces PATH... --json OUT`` replays recorded candidate pools under every cost
model (:mod:`echo_scheduler.replay.cli`; ``echo-sd sim --traces x --help`` lists its options);
without ``--traces`` it runs the synthetic comparison of :mod:`echo_scheduler.compare`.
Everything after ``sim`` goes to ``echo_scheduler.compare.main``.
"""

from __future__ import annotations

import argparse
from typing import Any

from echo_scheduler import compare


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="replay recorded pools (--traces) or synthetic steps through every policy",
        add_help=False,
    )
    p.add_argument("sim_args", nargs=argparse.REMAINDER)


def run(args: argparse.Namespace) -> int:
    return compare.main(args.sim_args)
