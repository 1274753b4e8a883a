"""The benchmark's outputs: the Markdown tables on stdout and the JSON document.

JSON schema ``echo-bench/1`` (docs/BENCHMARKS.md has the field-by-field reference)::

    {"schema": "echo-bench/1",
     "machine": {...}, "config": {...},
     "runs": [{"policy", "workload", "concurrency", "tokens_per_s", "speedup",
               "mean_accepted_length", "draft_yield", "selection", "outputs_match", ...}],
     "confidence": {policy: {"bins": [...], "depths": [{"depth", "accepted", "rejected"}]}},
     "projection": {...} | null,
     "failures": [str], "wall_s": float}
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from echo_lab.bench.intervals import cpu_name
from echo_lab.bench.metrics import CONFIDENCE_BINS, PHASES, RunResult, pooled_confidence
from echo_lab.bench.suite import SuiteResult

SCHEMA = "echo-bench/1"
REQUIRED_RUN_FIELDS = (
    "policy",
    "workload",
    "concurrency",
    "tokens_per_s",
    "speedup",
    "mean_accepted_length",
    "draft_yield",
    "selection",
    "outputs_match",
)


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on, including the load at the time of writing."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _match(x: bool | None) -> str:
    return "n/a" if x is None else ("yes" if x else "NO")


def _ci(ci: tuple[float, float] | None) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci is not None else ""


def markdown_table(runs: Sequence[RunResult]) -> str:
    """One row per run: throughput, speedup and acceptance metrics."""
    head = (
        "| workload | conc | policy | tok/s | speedup [95% CI] | busy speedup [95% CI] "
        "| tok/cpu-s | speedup (cpu) | MAT "
        "| yield "
        "| verified/step | selection | p50 ms/tok | p99 ms/tok | per-request speedup p10 / min "
        "| passed over | step / forward | outputs match |"
    )
    lines = [
        head,
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.workload} | {r.concurrency} | {r.policy} | {r.tokens_per_s:.1f} "
            f"| {_num(r.speedup, '.2f')} {_ci(r.speedup_ci95)} "
            f"| {_num(r.steady_speedup, '.2f')} {_ci(r.steady_speedup_ci95)} "
            f"| {r.tokens_per_cpu_s:.1f} "
            f"| {_num(r.speedup_cpu, '.2f')} "
            f"| {r.mean_accepted_length:.2f} | {r.draft_yield:.3f} "
            f"| {r.verified_per_step:.1f} | {_num(r.selection, '.3f')} "
            f"| {r.latency_p50_ms:.1f} | {r.latency_p99_ms:.1f} "
            f"| {_num(r.request_speedup_p10, '.2f')} / {_num(r.request_speedup_min, '.2f')} "
            f"| {r.longest_passed_over} | {_num(r.step_over_forward, '.2f')} "
            f"| {_match(r.outputs_match)} |"
        )
    return "\n".join(lines)


def speedup_matrix(runs: Sequence[RunResult]) -> str:
    """Per workload: wall-time speedup over plain decoding, policies x concurrency (CPU-time
    speedup, then mean accepted length, in brackets)."""
    concs = sorted({r.concurrency for r in runs})
    lines = []
    for w in dict.fromkeys(r.workload for r in runs):
        lines.append(f"\n**{w}**: speedup vs plain (CPU-time speedup; mean accepted length)\n")
        lines.append("| policy | " + " | ".join(f"c={c}" for c in concs) + " |")
        lines.append("|---|" + "---:|" * len(concs))
        for policy in dict.fromkeys(r.policy for r in runs):
            cells = []
            for c in concs:
                hit = [r for r in runs if (r.workload, r.policy, r.concurrency) == (w, policy, c)]
                cells.append(
                    f"{_num(hit[0].speedup, '.2f')} ({_num(hit[0].speedup_cpu, '.2f')}; "
                    f"{hit[0].mean_accepted_length:.2f})"
                    if hit
                    else "-"
                )
            lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def phase_table(runs: Sequence[RunResult]) -> str:
    """Mean milliseconds per decode step in each phase."""
    lines = [
        "| workload | conc | policy | steps | " + " | ".join(PHASES) + " |",
        "|---|---:|---|---:|" + "---:|" * len(PHASES),
    ]
    for r in runs:
        cells = " | ".join(f"{r.phase_ms_per_step.get(p, 0.0):.1f}" for p in PHASES)
        lines.append(f"| {r.workload} | {r.concurrency} | {r.policy} | {r.steps} | {cells} |")
    return "\n".join(lines)


def confidence_json(result: SuiteResult) -> dict[str, Any]:
    """Per policy (summed over workloads and concurrencies): per-depth histogram counts."""
    totals = pooled_confidence(result.accumulators)
    edges = [round(i / CONFIDENCE_BINS, 4) for i in range(CONFIDENCE_BINS + 1)]
    out: dict[str, Any] = {}
    for policy, hist in totals.items():
        depths = [
            {"depth": d + 1, "rejected": hist[d, 0].tolist(), "accepted": hist[d, 1].tolist()}
            for d in range(hist.shape[0])
            if int(hist[d].sum())
        ]
        out[policy] = {"bin_edges": edges, "depths": depths}
    return out


def bench_document(
    result: SuiteResult,
    config: Mapping[str, Any],
    projection: Mapping[str, Any] | None,
    wall_s: float,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "machine": machine_info(),
        "config": dict(config),
        "runs": [r.to_json() for r in result.runs],
        "confidence": confidence_json(result),
        "projection": dict(projection) if projection is not None else None,
        "failures": result.failures,
        "wall_s": round(wall_s, 1),
    }


def write_json(doc: Mapping[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def check_document(doc: Mapping[str, Any]) -> list[str]:
    """Schema problems of a bench JSON document (empty = valid)."""
    problems = []
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        return [*problems, "runs must be a non-empty list"]
    for i, run in enumerate(runs):
        missing = [k for k in REQUIRED_RUN_FIELDS if k not in run]
        if missing:
            problems.append(f"runs[{i}] lacks {', '.join(missing)}")
    return problems
