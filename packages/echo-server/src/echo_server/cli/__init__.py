"""``echo-sd``: the command-line entry point.

The serving commands live in sibling modules (``generate``, ``policies``, ``profile``,
``serve``), and ``controller`` is :mod:`echo_controller.cli` (also installed alone as
``echo-controller``). Other
packages add commands through the ``echo_sd.commands`` entry-point group: echo-lab registers
``demo``, ``bench``, ``bench-serve``, ``sim``, ``train-draft`` and ``calibrate`` there. A command
module has ``add_parser(subparsers)`` and ``run(args) -> int``; one whose ``PASS_THROUGH`` is true
receives the arguments ``echo-sd`` does not know in ``args.passthrough``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from types import ModuleType

from echo_controller import cli as controller
from echo_controller.logs import LEVELS, configure_logging
from echo_core.errors import EchoError
from echo_server.cli import generate, policies, profile, serve

PLUGIN_GROUP = "echo_sd.commands"
"""Entry-point group through which installed packages add ``echo-sd`` subcommands."""

BUILTIN: dict[str, ModuleType] = {
    "generate": generate,
    "policies": policies,
    "profile": profile,
    "serve": serve,
    "controller": controller,
}


def commands() -> dict[str, ModuleType]:
    """The built-in commands, then every installed plugin's (a plugin never shadows a built-in)."""
    found = dict(BUILTIN)
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        if ep.name not in found:
            found[ep.name] = ep.load()
    return found


def build_parser(table: Mapping[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="echo-sd", description="ECHO: elastic speculative decoding (serving node and tools)"
    )
    parser.add_argument("--log-level", choices=LEVELS, default="warning")
    parser.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (table if table is not None else commands()).values():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    table = commands()
    parser = build_parser(table)
    args, extra = parser.parse_known_args(argv)
    module = table[args.command]
    if getattr(module, "PASS_THROUGH", False):
        args.passthrough = [*extra, *getattr(args, "passthrough", [])]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    configure_logging(args.log_level, args.json_logs)
    try:
        return int(module.run(args))
    except EchoError as exc:
        print(f"echo-sd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
