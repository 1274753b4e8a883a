"""``echo-sd policies``: the drafting policies ``--policy`` offers, one line each (read from
echo-scheduler's policy registry)."""

from __future__ import annotations

import argparse
from typing import Any

from echo_scheduler.policies import policy_spec
from echo_server.cli.options import POLICY_CHOICES, policy_name


def descriptions() -> dict[str, str]:
    """``--policy`` choice -> its registered one-line summary."""
    return {c: policy_spec(policy_name(c)).summary for c in POLICY_CHOICES}


def add_parser(sub: Any) -> None:
    sub.add_parser("policies", help="list the drafting policies")


def run(args: argparse.Namespace) -> int:
    lines = descriptions()
    width = max(len(n) for n in lines)
    for name, text in lines.items():
        print(f"{name:<{width}}  {text}")
    return 0
