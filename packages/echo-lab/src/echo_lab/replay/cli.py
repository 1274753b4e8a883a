"""``echo-sd sim --traces PATH... --json OUT``: replay recorded pools under every cost model.

Each trace file is one workload (``trace-<name>.json[.gz]``, echo-trace/1). Cost models: ``cpu``
(from ``--cpu-cost``, default ``cost-cpu.json`` beside the first trace, measured by
``scripts/measure_cpu_cost.py``) at ``--cpu-batches``, the four rooflines (H100/H200 x
Llama-3.1-8B / Qwen3-235B-A22B on TP 8) at ``--gpu-batches``, and each measured GPU profile
(``--gpu-cost``, default every ``cost-gpu-<name>.json`` beside the first trace, written by
``scripts/gpu_check``; model ``<name>-measured``) at the ``--gpu-batches`` it measured.
Writes one JSON row per (trace, cost model, batch size, arm) with ``tokens_per_s``, ``eta``
and its factors, and against ``echo`` the paired difference with its bootstrap ``ci95`` (module
:mod:`~.run`), plus each grid family's best point (``chain*``, ``static*``, ``eagle2*``) and
the oracle. Cells run in ``--jobs`` worker processes; the numbers do not depend on it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from echo_gating.policy import GatePolicy
from echo_lab.replay.arms import Arm, default_arms, optional_arms, select_arms
from echo_lab.replay.costs import SOURCES, StepCost, load_profiled, roofline_costs
from echo_lab.replay.gates import GATE_NAMES
from echo_lab.replay.report import markdown_tables
from echo_lab.replay.run import (
    ReplaySpec,
    calibrate_rows,
    compose_steps,
    replay_cell,
    split_warmup,
)
from echo_lab.sim.rows import TraceRow, load_rows
from echo_scheduler.config import PolicyConfig
from echo_scheduler.errors import SchedulerError

FORMAT = "echo-sim-replay/1"
CPU_COST_FILE = "cost-cpu.json"
GPU_COST_GLOB = "cost-gpu-*.json"
_DEFAULT = ReplaySpec()


def trace_name(path: Path) -> str:
    """``trace-humaneval.json.gz`` -> ``humaneval`` (else the file name without suffixes)."""
    stem = re.sub(r"(\.json)?(\.gz)?$", "", path.name)
    return stem.removeprefix("trace-")


def _cell(
    job: tuple[
        str,
        list[TraceRow],
        list[TraceRow],
        dict[str, GatePolicy],
        list[Arm],
        list[StepCost],
        ReplaySpec,
        int,
    ],
) -> list[dict[str, Any]]:
    name, rows, warm, gates, arms, costs, spec, batch = job
    torch.set_num_threads(1)
    steps = compose_steps(rows, batch, spec.steps, spec.seed)
    tuning = compose_steps(warm, batch, spec.tune_steps, spec.seed + 1)
    return replay_cell(name, steps, gates, arms, costs, spec, tuning)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="echo-sd sim", description=__doc__.splitlines()[0])
    p.add_argument("--traces", type=Path, nargs="+", required=True, metavar="PATH")
    p.add_argument("--json", type=Path, default=None, metavar="OUT")
    p.add_argument("--markdown", type=Path, default=None, help="also write the summary tables")
    p.add_argument(
        "--cpu-cost",
        type=Path,
        default=None,
        help=f"default: {CPU_COST_FILE} beside "
        "the first trace (the cpu model is skipped when absent)",
    )
    p.add_argument(
        "--gpu-cost",
        type=Path,
        nargs="*",
        default=None,
        help=f"measured GPU profiles (default: {GPU_COST_GLOB} beside the first trace)",
    )
    p.add_argument("--cost-models", nargs="+", default=None, help="subset of the cost models")
    p.add_argument("--cpu-batches", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--gpu-batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument(
        "--arms",
        nargs="+",
        default=None,
        help="arm names or families (default: all but the optional <arm>+floor)",
    )
    p.add_argument("--steps", type=int, default=_DEFAULT.steps, help="composed steps per cell")
    p.add_argument("--seed", type=int, default=_DEFAULT.seed)
    p.add_argument("--calibration-share", type=float, default=_DEFAULT.calibration_share)
    p.add_argument("--resamples", type=int, default=_DEFAULT.resamples)
    p.add_argument(
        "--tune-steps",
        type=int,
        default=_DEFAULT.tune_steps,
        help="warm-up batches per cell for echo_utility's gate choice",
    )
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    return p.parse_args(argv)


def _costs(args: argparse.Namespace) -> tuple[list[tuple[StepCost, tuple[int, ...]]], list[str]]:
    """(cost model, its batch sizes) pairs, and notes on what was skipped."""
    notes: list[str] = []
    out: list[tuple[StepCost, tuple[int, ...]]] = []
    cpu_path = args.cpu_cost or args.traces[0].parent / CPU_COST_FILE
    if cpu_path.is_file():
        cpu = load_profiled(cpu_path)
        measured = [b for b in args.cpu_batches if b in cpu.batch_sizes]
        missing = sorted(set(args.cpu_batches) - set(measured))
        if missing:
            notes.append(f"cpu: batch sizes {missing} not measured in {cpu_path}, skipped")
        out.append((cpu, tuple(measured)))
    elif args.cpu_cost is not None:
        raise SchedulerError(f"--cpu-cost {cpu_path}: no such file")
    else:
        notes.append(f"cpu: no {cpu_path}, cpu cost model skipped")
    out += [(c, tuple(args.gpu_batches)) for c in roofline_costs().values()]
    gpu_paths = (
        sorted(args.traces[0].parent.glob(GPU_COST_GLOB))
        if args.gpu_cost is None
        else args.gpu_cost
    )
    seen = {c.name for c, _ in out}
    for path in gpu_paths:
        name = re.sub(r"\.json$", "", path.name).removeprefix("cost-gpu-") + "-measured"
        if name in seen:
            raise SchedulerError(f"{path}: cost model {name} is defined twice")
        seen.add(name)
        if args.cost_models and name not in args.cost_models:
            continue  # not loaded: a corrupt profile nobody asked for stops nothing
        gpu = load_profiled(path, name)
        measured = [b for b in args.gpu_batches if b in gpu.batch_sizes]
        if len(measured) < len(args.gpu_batches):
            missing = sorted(set(args.gpu_batches) - set(measured))
            notes.append(f"{name}: batch sizes {missing} not measured in {path}, skipped")
        out.append((gpu, tuple(measured)))
    if args.cost_models:
        unknown = sorted(set(args.cost_models) - seen)
        if unknown:
            raise SchedulerError(f"unknown cost models {unknown}; available: {sorted(seen)}")
        out = [(c, bs) for c, bs in out if c.name in args.cost_models]
    return out, notes


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    torch.set_num_threads(1)
    try:
        costs, notes = _costs(args)
        arms = select_arms(default_arms() + optional_arms(), args.arms)
        spec = ReplaySpec(
            args.steps, args.seed, args.calibration_share, args.resamples, args.tune_steps
        )
        config = PolicyConfig.high_concurrency()
        jobs = []
        for path in args.traces:
            name = trace_name(path)
            warm, evaluation = split_warmup(load_rows([path]), spec.calibration_share, spec.seed)
            gates = calibrate_rows(warm, config.max_depth)
            for b in sorted({b for _, bs in costs for b in bs}):
                at_b = [c for c, bs in costs if b in bs]
                jobs.append((name, evaluation, warm, gates, arms, at_b, spec, b))
    except (SchedulerError, ValueError) as exc:
        print(f"echo-sd sim: {exc}", file=sys.stderr)
        return 2
    if args.jobs > 1:
        # Largest batch first (a cell's work grows with B): the last cell to start is a small
        # one, so the workers finish together. Rows keep the traces' and batches' order.
        order = sorted(range(len(jobs)), key=lambda i: -jobs[i][-1])
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            done = dict(zip(order, pool.map(_cell, [jobs[i] for i in order]), strict=True))
        results = [done[i] for i in range(len(jobs))]
    else:
        results = [_cell(j) for j in jobs]
    rows = [r for cell in results for r in cell]
    print(summary_table(rows))
    for note in notes:
        print(f"note: {note}")
    if args.json:
        doc = {
            "format": FORMAT,
            "spec": {**asdict(spec), "traces": [str(p) for p in args.traces]},
            "cost_models": {c.name: c.describe() for c, _ in costs},
            "sources": SOURCES,
            "arms": [
                {
                    "arm": a.name,
                    "family": a.family,
                    "per_request": a.per_request,
                    "floor": a.floor,
                    "gate": a.gate,
                }
                for a in arms
            ],
            "rows": rows,
        }
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"json -> {args.json}")
    if args.markdown:
        args.markdown.write_text(markdown_tables(rows) + "\n", encoding="utf-8")
        print(f"markdown -> {args.markdown}")
    print(f"replayed {len(jobs)} cells in {time.perf_counter() - start:.0f} s")
    return 0


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per cell: plain, ECHO and its ablations, each family's best, the oracle; ratios to echo."""
    show = (
        "plain",
        *GATE_NAMES,
        "echo_utility",
        "chain*",
        "static*",
        "eagle2*",
        "global_topk/n=4",
        "oracle",
    )
    head = (
        f"{'trace':<10} {'cost':<18} {'B':>4} {'arm':<16} {'tok/s':>10} {'xplain':>7} "
        f"{'/echo':>6} {'95% CI':>15} {'eta':>5} {'MAL':>5} {'best of / gate':<14}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["arm"] not in show:
            continue
        ci = r.get("ratio_ci95")
        ci_s = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        ratio = f"{r['ratio_vs_echo']:.3f}" if "ratio_vs_echo" in r else ""
        mal = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""
        lines.append(
            f"{r['trace']:<10} {r['cost_model']:<18} {r['batch']:>4} {r['arm']:<16} "
            f"{r['tokens_per_s']:>10.1f} {r['vs_plain']:>7.3f} {ratio:>6} {ci_s:>15} "
            f"{r['eta']:>5.3f} {mal:>5} {r.get('best_of', r.get('gate_choice', '')):<14}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
