"""``echo-sd sim``: echo-scheduler's trace-driven simulator (every policy, same traces).

Everything after ``sim`` goes to ``python -m echo_scheduler.compare`` (``echo-sd sim --help``
lists its options: batch sizes, steps, workload, roofline context, policies, ``--json``).
"""

from __future__ import annotations

import argparse
from typing import Any

from echo_scheduler import compare


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="simulate every policy on the same traces with a latency model (echo-scheduler)",
        add_help=False,
    )
    p.add_argument("sim_args", nargs=argparse.REMAINDER)


def run(args: argparse.Namespace) -> int:
    return compare.main(args.sim_args)
