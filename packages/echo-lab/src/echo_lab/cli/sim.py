"""``echo-sd sim``: the simulator (every policy on the same steps).

``echo-sd sim --traces PATH... --json OUT`` replays recorded candidate pools under every cost
model (:mod:`echo_lab.replay.cli`; ``echo-sd sim --traces x --help`` lists its options);
without ``--traces`` it runs the synthetic comparison of :mod:`echo_lab.sim.compare`.
Everything after ``sim`` goes to ``echo_lab.sim.compare.main``.
"""

from __future__ import annotations

import argparse
from typing import Any

from echo_lab.sim import compare


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="replay recorded pools (--traces) or synthetic steps through every policy",
        add_help=False,
    )
    p.add_argument("passthrough", nargs=argparse.REMAINDER)


def run(args: argparse.Namespace) -> int:
    return compare.main(args.passthrough)


PASS_THROUGH = True
"""``echo-sd`` hands this command every argument it does not know (they belong to the replay)."""
