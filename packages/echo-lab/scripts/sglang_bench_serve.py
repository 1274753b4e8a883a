"""``echo-sd bench-serve`` against three real SGLang servers on this CPU: plain SGLang, SGLang's
EAGLE-3 worker and the ECHO plugin (both drafting with ECHO's head; echo_lab.sglang.harness).

    .venv/bin/python packages/echo-lab/scripts/sglang_bench_serve.py \\
        --rate 0.25 --rate 1 --rounds 3 --num-prompts 12 --json out.json

Every server is started once and paused (SIGSTOP) except the one being measured: SGLang's idle
scheduler polls without sleeping and would take a core from the measured server. Before each cell
bench-serve resumes that cell's server and pauses the others (``on_cell``); cells run in
interleaved rounds with the endpoint order rotated (echo_lab.cli.bench_serve). Any bench-serve
option after the script's own is passed through (``--workload``, ``--max-tokens``, ...).
Needs ``bash scripts/sglang/setup_env.sh`` first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from echo_lab.cli import bench_serve
from echo_lab.sglang.harness import CACHE, MODES, Environment, Server, start_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang_bench_serve")
    sub = parser.add_subparsers(dest="command", required=True)
    bench_serve.add_parser(sub)
    raw = list(sys.argv[1:] if argv is None else argv)
    env = Environment.default()
    servers: dict[str, Server] = {}
    try:
        for mode in MODES:
            servers[mode] = start_server(env, mode, CACHE / "sglang-logs")
            servers[mode].pause()
        endpoints = [f"--endpoint={m}={s.url}" for m, s in servers.items()]
        args = parser.parse_args(["bench-serve", *endpoints, *raw])

        def switch(name: str) -> None:
            for mode, server in servers.items():
                if mode != name:
                    server.pause()
            servers[name].resume()

        return bench_serve.run(args, on_cell=switch)
    finally:
        for server in servers.values():
            server.close()


if __name__ == "__main__":
    Path(CACHE).mkdir(exist_ok=True)
    sys.exit(main())
