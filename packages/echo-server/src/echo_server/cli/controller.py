"""``echo-sd controller``: the budget controller that splits a global budget across nodes.

Example (pool budget 24 tokens, 3 s leases renewed every 500 ms)::

    echo-sd controller --listen 127.0.0.1:7000 --global-budget 24 \\
        --lease-ttl-ms 3000 --report-interval-ms 500 --metrics-listen 127.0.0.1:9100
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from echo_server.cli.serve import add_server_options, run_until_signalled, server_config
from echo_server.grpc.calibration_pool import PoolConfig
from echo_server.grpc.controller_server import ControllerConfig, serve_controller
from echo_server.grpc.lease_table import LeaseConfig


def pool_budget(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected POOL=TOKENS, got {text!r}")
    return name, int(value)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("controller", help="run the budget controller (leases for nodes)")
    p.add_argument("--global-budget", type=int, required=True, help="G: tokens per pool")
    p.add_argument(
        "--pool-budget", type=pool_budget, action="append", default=[], help="POOL=TOKENS"
    )
    p.add_argument("--lease-ttl-ms", type=int, default=5000)
    p.add_argument("--lease-slack-ms", type=int, default=1000, help="lease delivery slack")
    p.add_argument("--report-interval-ms", type=int, default=1000)
    defaults = PoolConfig()
    p.add_argument("--calibration-min-records", type=int, default=defaults.min_records)
    p.add_argument("--calibration-max-records", type=int, default=defaults.max_records)
    p.add_argument("--calibration-interval-s", type=float, default=defaults.min_interval_s)
    p.add_argument("--state-file", type=Path, default=None, help="keeps epochs growing")
    add_server_options(p, "127.0.0.1:50050")


def run(args: argparse.Namespace) -> int:
    try:
        lease = LeaseConfig(
            global_budget=args.global_budget,
            pool_budgets=dict(args.pool_budget),
            ttl_ms=args.lease_ttl_ms,
            slack_ms=args.lease_slack_ms,
            report_interval_ms=args.report_interval_ms,
        )
        calibration = PoolConfig(
            max_records=args.calibration_max_records,
            min_records=args.calibration_min_records,
            min_interval_s=args.calibration_interval_s,
        )
    except ValueError as exc:
        raise SystemExit(f"echo-sd controller: {exc}") from None
    config = ControllerConfig(
        server=server_config(args),
        lease=lease,
        calibration=calibration,
        metrics_listen=args.metrics_listen,
        ready_file=args.ready_file,
        state_file=args.state_file,
    )
    return asyncio.run(run_until_signalled(lambda stop: serve_controller(config, stop)))
