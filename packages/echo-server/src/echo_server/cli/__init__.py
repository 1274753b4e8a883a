"""``echo-sd``: the command-line entry point (subcommands live in sibling modules, but
``controller``: :mod:`echo_controller.cli`, also installed alone as ``echo-controller``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from echo_controller import cli as controller
from echo_controller.logs import LEVELS, configure_logging
from echo_core.errors import EchoError
from echo_server.cli import (
    bench,
    bench_serve,
    calibrate,
    demo,
    generate,
    policies,
    serve,
    sim,
    train_draft,
)

COMMANDS = {
    "generate": generate,
    "policies": policies,
    "demo": demo,
    "serve": serve,
    "controller": controller,
    "bench": bench,
    "bench-serve": bench_serve,
    "sim": sim,
    "train-draft": train_draft,
    "calibrate": calibrate,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="echo-sd", description="ECHO: elastic speculative decoding (serving node and tools)"
    )
    parser.add_argument("--log-level", choices=LEVELS, default="warning")
    parser.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # `sim` forwards its options to echo-scheduler's simulator; everything else is strict.
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "sim":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "sim":
        args.sim_args = [*extra, *args.sim_args]
    configure_logging(args.log_level, args.json_logs)
    try:
        return int(COMMANDS[args.command].run(args))
    except EchoError as exc:
        print(f"echo-sd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
