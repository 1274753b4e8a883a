"""Simulator traces from real runs: save them, split them into per-request rows, recompose.

A real run at concurrency C records batches of C requests; the projection needs batches of
64-256. Every recorded step is split into *rows* (one request's pool, its continuation and its
cap: the unit a step is made of, independent of its batch mates under greedy acceptance), and a
synthetic batch of any size is composed by drawing rows at random (seeded, with replacement).
The drafter saw each request alone, so a composed batch is exactly what the same drafter would
have proposed for those requests at that point of their generation.

Files are echo-scheduler's ``echo-trace/1`` (:mod:`echo_scheduler.trace`), one per workload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from echo_core.tree import make_tree
from echo_scheduler.trace import RecordedStep, load_trace, save_trace
from echo_server.bench.oracle import NO_TOKEN


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request's part of one recorded step."""

    nodes: tuple[tuple[int, int, float], ...]  # (token, request-local parent, draft log-prob)
    target: tuple[int, ...]  # the continuation after the root
    max_nodes: int


def save_traces(traces: Mapping[str, Sequence[RecordedStep]], out_dir: Path) -> list[Path]:
    """``trace-<workload>.json`` per workload with recorded steps."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, steps in traces.items():
        if steps:
            path = out_dir / f"trace-{name}.json"
            save_trace(steps, path)
            paths.append(path)
    return paths


def load_rows(paths: Sequence[Path]) -> list[TraceRow]:
    return [row for p in paths for step in load_trace(p) for row in split_rows(step)]


def split_rows(step: RecordedStep) -> list[TraceRow]:
    """The step's requests as rows (requests that drafted nothing are skipped)."""
    pool = step.pool
    cu = pool.cu_nodes.tolist()
    tokens, parents = pool.token.tolist(), pool.parent.tolist()
    logprobs = pool.draft_logprob.tolist()
    rows = []
    for b in range(pool.batch_size):
        lo, hi = cu[b], cu[b + 1]
        if lo == hi:
            continue
        nodes = tuple(zip(tokens[lo:hi], parents[lo:hi], logprobs[lo:hi], strict=True))
        target = tuple(t for t in step.target[b].tolist() if t != NO_TOKEN)
        rows.append(TraceRow(nodes, target, int(step.max_nodes[b])))
    return rows


def compose(rows: Sequence[TraceRow], batch_size: int, generator: torch.Generator) -> RecordedStep:
    """A step of ``batch_size`` rows drawn uniformly with replacement."""
    if not rows:
        raise ValueError("no trace rows to compose a step from")
    pick = torch.randint(0, len(rows), (batch_size,), generator=generator).tolist()
    chosen = [rows[i] for i in pick]
    depth = max(1, max(len(r.target) for r in chosen))
    target = torch.full((batch_size, depth), NO_TOKEN, dtype=torch.int64)
    for b, r in enumerate(chosen):
        if r.target:
            target[b, : len(r.target)] = torch.tensor(r.target, dtype=torch.int64)
    pool = make_tree([list(r.nodes) for r in chosen])
    caps = torch.tensor([r.max_nodes for r in chosen], dtype=torch.int64)
    return RecordedStep(pool=pool, target=target, max_nodes=caps)
