"""``echo-controller`` (also ``echo-sd controller``): the budget controller that splits a global
budget across nodes, and the server options both it and ``echo-sd serve`` take.

Example (pool budget 24 tokens, 3 s leases renewed every 500 ms)::

    echo-controller --listen 127.0.0.1:7000 --global-budget 24 \\
        --lease-ttl-ms 3000 --report-interval-ms 500 --metrics-listen 127.0.0.1:9100

Calibration sharing needs echo-gating (``pip install 'echo-controller[calibration]'``); a host
with echo-controller alone runs with ``--no-calibration``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from echo_controller.calibration import CalibrationUnavailableError, PoolConfig
from echo_controller.lease_table import LeaseConfig
from echo_controller.logs import LEVELS, configure_logging
from echo_controller.metrics_http import METRICS_AUTH
from echo_controller.process import ControllerConfig, serve_controller
from echo_controller.security import DEFAULT_MAX_MESSAGE_BYTES, ServerTls, read_token
from echo_controller.server import ServerConfig

DEFAULT_LISTEN = "127.0.0.1:50050"
HELP = "run the budget controller (leases for nodes)"


# -- shared with `echo-sd serve` -------------------------------------------------------------------


def add_server_options(p: argparse.ArgumentParser, default_listen: str) -> None:
    """Listening address, TLS / mTLS, bearer token, limits, metrics and the ready file."""
    g = p.add_argument_group("server")
    g.add_argument("--listen", default=default_listen, help="host:port (port 0: any free one)")
    g.add_argument("--tls-cert", type=Path, default=None, help="server certificate (PEM)")
    g.add_argument("--tls-key", type=Path, default=None, help="server private key (PEM)")
    g.add_argument(
        "--tls-client-ca", type=Path, default=None, help="require client certificates (mTLS)"
    )
    g.add_argument(
        "--token-file", type=Path, default=None, help="require 'authorization: Bearer <token>'"
    )
    g.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES)
    g.add_argument(
        "--metrics-listen", default=None, help="host:port of /metrics (Prometheus; :port = local)"
    )
    g.add_argument(
        "--metrics-auth",
        choices=METRICS_AUTH,
        default="auto",
        help="server: the gRPC server's TLS, client CA and token; auto: server unless loopback",
    )
    g.add_argument(
        "--health-listen",
        default=None,
        help="host:port of a plaintext health-only gRPC port for probes without a client cert",
    )
    g.add_argument("--ready-file", type=Path, default=None, help="write bound ports here (JSON)")
    p.set_defaults(server_prog=p.prog)


def server_config(args: argparse.Namespace) -> ServerConfig:
    prog = args.server_prog
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit(f"{prog}: give both --tls-cert and --tls-key, or neither")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise SystemExit(f"{prog}: --tls-client-ca (mTLS) needs --tls-cert and --tls-key")
    tls = ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    return ServerConfig(
        args.listen,
        tls,
        read_token(args.token_file),
        args.max_message_bytes,
        health_listen=args.health_listen,
        metrics_auth=args.metrics_auth,
    )


async def run_until_signalled(main: Any) -> int:
    """Run ``main(stop)`` with ``stop`` set by SIGINT / SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await main(stop)
    return 0


# -- the controller ----------------------------------------------------------------------------


def pool_budget(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected POOL=TOKENS, got {text!r}")
    return name, int(value)


def add_options(p: argparse.ArgumentParser) -> None:
    """The controller's options (the ``echo-sd controller`` subcommand and ``echo-controller``)."""
    p.add_argument("--global-budget", type=int, required=True, help="G: tokens per pool")
    p.add_argument(
        "--pool-budget", type=pool_budget, action="append", default=[], help="POOL=TOKENS"
    )
    p.add_argument("--lease-ttl-ms", type=int, default=5000)
    p.add_argument("--lease-slack-ms", type=int, default=1000, help="lease delivery slack")
    p.add_argument("--report-interval-ms", type=int, default=1000)
    c = p.add_argument_group("calibration sharing (needs echo-gating)")
    c.add_argument(
        "--no-calibration",
        action="store_true",
        help="do not pool warm-up records nor recalibrate gates; nodes keep their own gates",
    )
    defaults = PoolConfig()
    c.add_argument("--calibration-min-records", type=int, default=defaults.min_records)
    c.add_argument("--calibration-max-records", type=int, default=defaults.max_records)
    c.add_argument("--calibration-interval-s", type=float, default=defaults.min_interval_s)
    p.add_argument("--state-file", type=Path, default=None, help="keeps epochs growing")
    add_server_options(p, DEFAULT_LISTEN)
    p.set_defaults(controller_prog=p.prog)


def add_parser(sub: Any) -> None:
    """``echo-sd controller``: the same options as ``echo-controller``."""
    add_options(sub.add_parser("controller", help=HELP))


def run(args: argparse.Namespace) -> int:
    prog = args.controller_prog
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
        raise SystemExit(f"{prog}: {exc}") from None
    config = ControllerConfig(
        server=server_config(args),
        lease=lease,
        calibration=None if args.no_calibration else calibration,
        metrics_listen=args.metrics_listen,
        ready_file=args.ready_file,
        state_file=args.state_file,
    )
    try:
        return asyncio.run(run_until_signalled(lambda stop: serve_controller(config, stop)))
    except CalibrationUnavailableError as exc:  # raised before anything is bound or written
        raise SystemExit(f"{prog}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="echo-controller", description=f"ECHO: {HELP}")
    parser.add_argument("--log-level", choices=LEVELS, default="warning")
    parser.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    add_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``echo-controller`` console script."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.json_logs)
    try:
        return run(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
