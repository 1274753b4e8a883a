"""``echo-sd bench``: every policy side by side on real prompts at rising concurrency.

Runs the suite (:mod:`echo_lab.bench.suite`), prints the Markdown tables, writes the JSON
document (``--json``, schema ``echo-bench/1``), the PNG plots and the simulator traces into
``--out``, and projects the recorded draft trees to H100/H200 scale
(:mod:`echo_lab.bench.projection`). Exit status 1 when any greedy output differs from plain
decoding. ``--project-only TRACE...`` skips the real runs and projects saved traces.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import structlog
import torch

from echo_core.errors import EchoError
from echo_lab.bench.divergence import top2_gap
from echo_lab.bench.metrics import RunResult
from echo_lab.bench.plots import write_plots
from echo_lab.bench.projection import ProjectionSpec, project, projection_tables
from echo_lab.bench.report import (
    bench_document,
    markdown_table,
    phase_table,
    speedup_matrix,
    write_json,
)
from echo_lab.bench.suite import SuiteResult, SuiteSpec, run_suite
from echo_lab.bench.traces import load_rows, save_traces, split_rows
from echo_lab.bench.workloads import BUILTIN_WORKLOADS, Workload, load_workloads
from echo_server.assets import DEFAULT_HEAD
from echo_server.cli.options import POLICY_CHOICES, add_engine_options, build_engine, load
from echo_server.engine import Engine
from echo_server.model.loader import LoadedModel

log = structlog.get_logger(__name__)

QUICK = {
    "policies": ["plain", "eagle2", "global-topk", "echo"],
    "num_prompts": 6,
    "concurrency": [1, 8],
    "max_tokens": 32,
    "projection_steps": 6,
}
"""``--quick``: what it overrides (under 10 minutes on the 2-core dev CPU when quiet)."""
TRACE_POLICY = "global-topk"
"""Its pools are drafted to full depth without gating: the simulator's replayable traces."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmark the policies side by side on real prompts")
    p.add_argument("--policies", nargs="+", choices=POLICY_CHOICES, default=list(POLICY_CHOICES))
    p.add_argument(
        "--workloads", nargs="*", choices=BUILTIN_WORKLOADS, default=list(BUILTIN_WORKLOADS)
    )
    p.add_argument("--prompts", type=Path, default=None, help="your own prompts (JSONL)")
    p.add_argument("--num-prompts", type=int, default=16, help="prompts per workload")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default) or 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per cell (order rotated)"
    )
    p.add_argument(
        "--interleave",
        choices=("step", "run"),
        default="step",
        help="step: a round runs every policy's engine at once, one step each in turn, each "
        "timed on its own steps (drift shared step by step; every engine's KV pool is held at "
        "once); run: one policy's run after another",
    )
    p.add_argument("--quick", action="store_true", help="a few-minute run: " + str(QUICK))
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="plots, traces, JSON")
    p.add_argument("--json", type=Path, default=None, help="JSON path (default OUT/bench.json)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-projection", action="store_true")
    p.add_argument("--projection-steps", type=int, default=24, help="batches per point")
    p.add_argument("--projection-batches", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument(
        "--project-only",
        type=Path,
        nargs="+",
        default=None,
        metavar="TRACE",
        help="skip the real runs: project these echo-trace/1 files",
    )
    p.add_argument("--no-progress", action="store_true")
    add_engine_options(p)
    # The benchmark is about the learned drafter when it ships (generate's auto picks n-gram).
    p.set_defaults(drafter="eagle" if DEFAULT_HEAD.is_file() else "ngram")


def _apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)


def _factory(loaded: LoadedModel, args: argparse.Namespace, workloads: list[Workload]) -> Any:
    """(policy, concurrency) -> engine; the KV pool is sized so C requests always fit."""
    tok = loaded.tokenizer
    longest = max(len(tok.encode(p.text)) for w in workloads for p in w.prompts) + 64
    longest_out = max([args.max_tokens] + [p.max_tokens or 0 for w in workloads for p in w.prompts])

    def make(policy: str, concurrency: int) -> Engine:
        slots = max(args.kv_slots, concurrency * (longest + longest_out) + 1024)
        ns = argparse.Namespace(**{**vars(args), "max_batch": concurrency, "kv_slots": slots})
        return build_engine(loaded, policy, ns)

    return make


def _projection_spec(args: argparse.Namespace) -> ProjectionSpec:
    return ProjectionSpec(
        batches=tuple(args.projection_batches), steps=args.projection_steps, seed=args.seed
    )


def _project(args: argparse.Namespace, rows: list[Any]) -> dict[str, Any] | None:
    if args.no_projection:
        return None
    if not rows:
        log.warning("projection_skipped", reason=f"no {TRACE_POLICY} run recorded a trace")
        return None
    try:
        return project(rows, _projection_spec(args))
    except EchoError as exc:  # too few trace rows to calibrate the gates from
        log.warning("projection_skipped", reason=str(exc), rows=len(rows))
        return None


def run(args: argparse.Namespace) -> int:
    _apply_quick(args)
    if args.threads is None:  # two threads stall whenever another process holds a core
        args.threads = 1
        torch.set_num_threads(1)
    start = time.perf_counter()
    json_path: Path = args.json or args.out / "bench.json"
    if args.project_only:
        doc = project(load_rows(args.project_only), _projection_spec(args))
        print(projection_tables(doc))
        write_json({"schema": "echo-bench-projection/1", "projection": doc}, json_path)
        return 0
    workloads = load_workloads(args.workloads, args.num_prompts, args.prompts)
    loaded = load(args)
    spec = SuiteSpec(
        policies=tuple(args.policies),
        concurrency=tuple(args.concurrency),
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        trace_policy=None if args.no_projection else TRACE_POLICY,
        rounds=args.rounds,
        lockstep=args.interleave == "step",
    )

    def gap(prompt_ids: list[int], prefix: list[int]) -> float:
        return top2_gap(loaded, prompt_ids, prefix)

    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "runs.jsonl"
    partial.write_text("", encoding="utf-8")

    def checkpoint(row: RunResult) -> None:
        with partial.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(row.to_json()) + "\n")

    result: SuiteResult = run_suite(
        _factory(loaded, args, workloads),
        workloads,
        spec,
        gap,
        progress=not args.no_progress,
        on_run=checkpoint,
    )
    traces = save_traces(result.traces, args.out)
    rows = [row for steps in result.traces.values() for s in steps for row in split_rows(s)]
    projection = _project(args, rows)
    config = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k not in ("func",)
    }
    doc = bench_document(result, config, projection, time.perf_counter() - start)
    write_json(doc, json_path)
    plots = [] if args.no_plots else write_plots(result, args.out)

    print(markdown_table(result.runs))
    print(speedup_matrix(result.runs))
    print()
    print(phase_table(result.runs))
    if projection is not None:
        print(projection_tables(projection))
    print(
        f"\njson -> {json_path}; plots -> {', '.join(map(str, plots)) or 'none'}; "
        f"traces -> {', '.join(map(str, traces)) or 'none'}; "
        f"wall {time.perf_counter() - start:.0f} s"
    )
    for failure in result.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if result.failures else 0
