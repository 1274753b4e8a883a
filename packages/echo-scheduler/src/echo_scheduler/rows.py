"""Trace rows: one request's part of one recorded step, and batches of any size composed from them.

A real run at concurrency C records batches of C requests; a replay needs batches of 1-256.
Every recorded step is split into *rows* (one request's pool, its continuation and its cap: the
unit a step is made of, independent of its batch mates under greedy acceptance), and a batch of
any size is composed by drawing rows at random (seeded, with replacement). The drafter saw each
request alone, so a composed batch is exactly what the same drafter would have proposed for
those requests at that point of their generation.

Continuations are padded with :data:`NO_TOKEN` past the end of an output (it matches no drafted
token). Files are echo-trace/1 (:mod:`echo_scheduler.trace`), one per workload.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from echo_core.tree import make_tree
from echo_scheduler.errors import TraceError
from echo_scheduler.trace import RecordedStep, load_trace

NO_TOKEN = -1
"""Padding of continuations past the end of an output: matches no drafted token."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request's part of one recorded step."""

    nodes: tuple[tuple[int, int, float], ...]  # (token, request-local parent, draft log-prob)
    target: tuple[int, ...]  # the continuation after the root
    max_nodes: int


def load_rows(paths: Sequence[str | Path]) -> list[TraceRow]:
    """Every row of every step of the echo-trace/1 files ``paths``, in file order."""
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
        raise TraceError("no trace rows to compose a step from")
    pick = torch.randint(0, len(rows), (batch_size,), generator=generator).tolist()
    return stack([rows[i] for i in pick])


def stack(rows: Sequence[TraceRow]) -> RecordedStep:
    """One step whose requests are ``rows``, in order."""
    if not rows:
        raise TraceError("no trace rows to stack into a step")
    depth = max(1, max(len(r.target) for r in rows))
    target = torch.full((len(rows), depth), NO_TOKEN, dtype=torch.int64)
    for b, r in enumerate(rows):
        if r.target:
            target[b, : len(r.target)] = torch.tensor(r.target, dtype=torch.int64)
    pool = make_tree([list(r.nodes) for r in rows])
    caps = torch.tensor([r.max_nodes for r in rows], dtype=torch.int64)
    return RecordedStep(pool=pool, target=target, max_nodes=caps)
