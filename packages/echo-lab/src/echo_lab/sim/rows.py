"""Trace rows: one request's part of one recorded step, and batches of any size composed from them.

A real run at concurrency C records batches of C requests; a replay needs batches of 1-256.
Every recorded step is split into *rows* (one request's pool, its continuation and its cap: the
unit a step is made of, independent of its batch mates under greedy acceptance), and a batch of
any size is composed by drawing rows at random (seeded, with replacement). The drafter saw each
request alone, so a composed batch is exactly what the same drafter would have proposed for
those requests at that point of their generation.

Continuations are padded with :data:`NO_TOKEN` past the end of an output (it matches no drafted
token). Files are echo-trace/1 (:mod:`echo_lab.sim.trace`), one per workload.

When the recording kept request identity (``request``, ``request_step``), batches can instead
be composed from *streams* (:func:`compose_streams`): slot s of the batch replays one request's
rows in its own order, starting at a seeded offset and moving on to the next request of a
seeded cycle when that one ends, so a policy that learns per request or per load (its ledgers)
sees each slot's requests as the engine would. Slot s's visits are named ``"s/v"`` (visit v),
so two slots replaying the same recorded request are two requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from echo_core.tree import make_tree
from echo_lab.sim.trace import RecordedStep, load_trace
from echo_scheduler.errors import TraceError

NO_TOKEN = -1
"""Padding of continuations past the end of an output: matches no drafted token."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request's part of one recorded step."""

    nodes: tuple[tuple[int, int, float], ...]  # (token, request-local parent, draft log-prob)
    target: tuple[int, ...]  # the continuation after the root
    max_nodes: int
    request: str | None = None  # the request it belongs to, when the recording kept it
    request_step: int | None = None  # that request's decode step (1 = its first)


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
        request = None if step.requests is None else step.requests[b]
        number = None if step.request_steps is None else step.request_steps[b]
        rows.append(TraceRow(nodes, target, int(step.max_nodes[b]), request, number))
    return rows


def compose(rows: Sequence[TraceRow], batch_size: int, generator: torch.Generator) -> RecordedStep:
    """A step of ``batch_size`` rows drawn uniformly with replacement."""
    if not rows:
        raise TraceError("no trace rows to compose a step from")
    pick = torch.randint(0, len(rows), (batch_size,), generator=generator).tolist()
    return stack([rows[i] for i in pick])


def has_requests(rows: Sequence[TraceRow]) -> bool:
    """Every row knows its request and step (streams can be composed)."""
    return bool(rows) and all(r.request is not None and r.request_step is not None for r in rows)


def streams(rows: Sequence[TraceRow]) -> list[list[TraceRow]]:
    """Rows grouped by request (in order of first appearance), each in its request's step
    order."""
    if not has_requests(rows):
        raise TraceError("streams need rows that know their request (re-record the trace)")
    by: dict[str, list[TraceRow]] = {}
    for r in rows:
        by.setdefault(str(r.request), []).append(r)
    lanes = [sorted(v, key=lambda r: int(r.request_step or 0)) for v in by.values()]
    for lane in lanes:
        numbers = [r.request_step for r in lane]
        if len(set(numbers)) != len(numbers):
            raise TraceError(
                f"request {lane[0].request!r} has a decode step twice: two runs share its id "
                "(record one run per trace, or give each run's requests their own ids)"
            )
    return lanes


def compose_streams(
    rows: Sequence[TraceRow], batch_size: int, steps: int, generator: torch.Generator
) -> list[RecordedStep]:
    """``steps`` steps of ``batch_size`` slots, each replaying requests in order (module
    docstring): slot s starts at request ``cycle[s mod n]`` (a seeded permutation of the n
    requests) at a uniform offset into it, and takes the next request of the cycle after the
    last row of the current one."""
    if batch_size < 1 or steps < 1:
        raise TraceError(f"batch size and steps must be >= 1, got {batch_size}, {steps}")
    lanes = streams(rows)
    n = len(lanes)
    cycle = torch.randperm(n, generator=generator).tolist()
    at = [s % n for s in range(batch_size)]  # position in the cycle
    pos = [int(torch.randint(0, len(lanes[cycle[a]]), (1,), generator=generator)) for a in at]
    visit = [0] * batch_size
    out = []
    for _ in range(steps):
        picked, names, numbers = [], [], []
        for s in range(batch_size):
            if pos[s] >= len(lanes[cycle[at[s]]]):
                at[s], pos[s], visit[s] = (at[s] + 1) % n, 0, visit[s] + 1
            row = lanes[cycle[at[s]]][pos[s]]
            picked.append(row)
            names.append(f"{s}/{visit[s]}")
            numbers.append(pos[s] + 1)
            pos[s] += 1
        out.append(replace(stack(picked), requests=tuple(names), request_steps=tuple(numbers)))
    return out


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
