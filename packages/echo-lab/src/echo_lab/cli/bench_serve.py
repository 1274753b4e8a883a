"""``echo-sd bench-serve``: open-loop load against running nodes, compared in interleaved rounds.

Example (a plain node and an ECHO node on one machine, two request rates, three rounds)::

    echo-sd bench-serve --endpoint plain=http://127.0.0.1:8001 \\
        --endpoint echo=http://127.0.0.1:8002 --rate 0.5 --rate 1 --rounds 3 --json out.json

In each round every (rate, endpoint) cell gets the same prompts on the same Poisson schedule,
the endpoints' order rotated by one per round; the first endpoint is the reference of the
ratios (output tok/s, and TPOT as a speedup: reference TPOT / endpoint TPOT), each the median
over rounds with a t-interval (:func:`echo_lab.bench.intervals.round_ratio`). Metrics:
:mod:`echo_lab.bench.serve_load`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from echo_controller.security import read_token
from echo_lab.bench.intervals import cpu_name, rotated, round_ratio
from echo_lab.bench.serve_load import (
    Endpoint,
    LoadSpec,
    RequestResult,
    arrival_offsets,
    run_load,
    summarize,
)
from echo_lab.bench.workloads import BUILTIN_WORKLOADS, load_workloads
from echo_server.prompts import Prompt

SHOWN = (
    ("output_tok_s", "out tok/s", ".2f"),
    ("request_throughput", "req/s", ".3f"),
    ("ttft_p50_ms", "TTFT p50", ".0f"),
    ("ttft_p99_ms", "TTFT p99", ".0f"),
    ("tpot_p50_ms", "TPOT p50", ".1f"),
    ("tpot_p99_ms", "TPOT p99", ".1f"),
    ("itl_p50_ms", "ITL p50", ".1f"),
    ("itl_p99_ms", "ITL p99", ".1f"),
    ("errors", "errors", ".0f"),
)


def rate(text: str) -> float:
    value = math.inf if text in ("inf", "max") else float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a rate must be > 0 requests/s or 'inf', got {text!r}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench-serve", help="open-loop load against running nodes (HTTP / gRPC)")
    p.add_argument(
        "--endpoint",
        action="append",
        type=Endpoint.parse,
        required=True,
        help="NAME=http://host:port or NAME=grpc://host:port (repeat; the first is the reference)",
    )
    p.add_argument(
        "--rate",
        action="append",
        type=rate,
        default=None,
        help="requests/s, Poisson arrivals; 'inf' = all at once (repeatable; default 1)",
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    p.add_argument("--num-prompts", type=int, default=16, help="requests per cell")
    p.add_argument("--workload", choices=BUILTIN_WORKLOADS, default="mtbench")
    p.add_argument("--prompts", type=Path, default=None, help="JSONL prompts instead")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="every request runs to max-tokens")
    p.add_argument("--model", default=None, help="HTTP model id (default: the server's)")
    p.add_argument("--token-file", type=Path, default=None, help="bearer token of the servers")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every run and the table here")
    p.add_argument("--no-progress", action="store_true")


def _prompts(args: argparse.Namespace) -> list[Prompt]:
    names = [] if args.prompts else [args.workload]
    pool = [p for w in load_workloads(names, None, args.prompts) for p in w.prompts]
    if not pool:
        raise SystemExit("echo-sd bench-serve: no prompts")
    return [pool[i % len(pool)] for i in range(args.num_prompts)]


def run(args: argparse.Namespace, on_cell: Callable[[str], None] | None = None) -> int:
    """The command (module docstring). ``on_cell(name)`` runs before each (round, rate,
    endpoint) cell's load, e.g. to resume that endpoint's server and pause the others."""
    if args.rounds < 1 or args.num_prompts < 1:
        raise SystemExit("echo-sd bench-serve: --rounds and --num-prompts must be >= 1")
    names = [e.name for e in args.endpoint]
    if len(set(names)) != len(names):
        raise SystemExit(f"echo-sd bench-serve: endpoint names must differ: {names}")
    rates: list[float] = args.rate or [1.0]
    prompts = _prompts(args)
    spec = LoadSpec(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        model=args.model,
        token=read_token(args.token_file),
    )
    total = args.rounds * len(rates) * len(names) * len(prompts)
    bar = tqdm(total=total, unit="req", disable=args.no_progress)
    runs: list[dict[str, Any]] = []
    by_name = {e.name: e for e in args.endpoint}
    for r in range(args.rounds):
        for rate_value in rates:
            offsets = arrival_offsets(len(prompts), rate_value, args.seed + r)
            for name in rotated(names, r):
                bar.set_description(f"round {r + 1} rate {rate_value:g} {name}")
                if on_cell is not None:
                    on_cell(name)
                results, duration = asyncio.run(
                    run_load(
                        by_name[name],
                        prompts,
                        offsets,
                        spec,
                        args.max_concurrency,
                        on_done=lambda _res: bar.update(),
                    )
                )
                runs.append(_run_row(name, rate_value, r, results, duration))
    bar.close()
    table = _table(runs, names, rates)
    print(_render(table, args))
    if args.json is not None:
        meta = {
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
            "endpoints": {e.name: e.url for e in args.endpoint},
            "rates": [str(x) for x in rates],
            "num_prompts": len(prompts),
            "workload": str(args.prompts or args.workload),
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "rounds": args.rounds,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        args.json.write_text(json.dumps({"meta": meta, "table": table, "runs": runs}, indent=1))
    return 1 if any(row["errors"] for row in table) else 0


def _run_row(
    name: str, rate_value: float, r: int, results: list[RequestResult], duration: float
) -> dict[str, Any]:
    errors = sorted({res.error for res in results if res.error})[:3]
    return {
        "endpoint": name,
        "rate": str(rate_value),
        "round": r,
        **summarize(results, duration),
        "first_errors": errors,
    }


def _table(
    runs: list[dict[str, Any]], names: list[str], rates: list[float]
) -> list[dict[str, Any]]:
    """Per (rate, endpoint): the median of each metric over rounds, and ratios to names[0]."""
    rows = []
    for rate_value in rates:
        cell = {
            n: [x for x in runs if x["endpoint"] == n and x["rate"] == str(rate_value)]
            for n in names
        }
        ref = cell[names[0]]
        for name in names:
            mine = cell[name]
            row: dict[str, Any] = {"rate": str(rate_value), "endpoint": name}
            for key in mine[0]:
                if key not in ("endpoint", "rate", "round", "first_errors"):
                    values = [m[key] for m in mine if not math.isnan(m[key])]
                    row[key] = statistics.median(values) if values else math.nan
            row["errors"] = sum(m["errors"] for m in mine)
            for key, label, invert in (
                ("output_tok_s", "throughput_ratio", False),
                ("tpot_p50_ms", "tpot_speedup", True),
            ):
                pairs = [(a[key], b[key]) for a, b in zip(ref, mine, strict=True)]
                ratios = [(a / b if invert else b / a) for a, b in pairs if a > 0 and b > 0]
                if ratios:
                    pr = round_ratio(ratios)
                    row[label] = {
                        "median": pr.ratio,
                        "ci95": list(pr.ci95),
                        "rounds": list(pr.rounds),
                    }
            rows.append(row)
    return rows


def _render(table: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = f"{'rate':>6} {'endpoint':>10} " + " ".join(f"{label:>10}" for _, label, _ in SHOWN)
    head += f" {'tok/s vs ' + args.endpoint[0].name:>22} {'TPOT speedup':>22}"
    lines = [f"bench-serve on {cpu_name()}, {args.rounds} round(s), medians over rounds", head]
    for row in table:
        cells = " ".join(f"{row[key]:>10{fmt}}" for key, _, fmt in SHOWN)
        extra = ""
        for label in ("throughput_ratio", "tpot_speedup"):
            ratio = row.get(label)
            extra += (
                f" {ratio['median']:>8.2f}x ({ratio['ci95'][0]:.2f}-{ratio['ci95'][1]:.2f})"
                if ratio
                else f" {'-':>22}"
            )
        lines.append(f"{row['rate']:>6} {row['endpoint']:>10} {cells}{extra}")
    return "\n".join(lines)
