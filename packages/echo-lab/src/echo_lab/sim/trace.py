"""Recorded traces: what the engine logs per step, replayed as a drafter for any policy.

A recorded step holds the step's full candidate pool (every node the drafter produced, drafted
wide and deep enough for the policies to be replayed), the target's greedy continuation
``target`` ([B, D]; a node is accepted iff its token path equals the continuation's prefix) and
the per-request caps. Replaying: a policy's expansion of node f returns the first ``topk``
recorded children of the recorded node with f's token path (children in recorded rank order);
expansions beyond the recording return what was recorded (fewer children, or none).

File format (JSON, ``"format": "echo-trace/1"``): ``steps`` is a list of objects with
``cu_nodes``, ``token``, ``parent`` (request-local), ``draft_logprob``, ``target`` (list of B
lists) and ``max_nodes``, and optionally ``requests`` (B request ids: which request each row
belongs to) with ``request_steps`` (B ints: that request's decode step, 1 for its first; a
file's steps are in settling order, which need not be each request's order); files written
before these existed have neither. Depths and path log-probs are derived on load.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from echo_core.tree import ROOT, TreeBatch, make_tree
from echo_scheduler.config import PolicyConfig
from echo_scheduler.driver import drive_step
from echo_scheduler.errors import TraceError
from echo_scheduler.interface import DraftPlan, StepBatch
from echo_scheduler.outcome import accepted_mask
from echo_scheduler.policies.global_topk import GlobalTopKPolicy
from echo_scheduler.pool import Children
from echo_scheduler.ranking import rank_in_group
from echo_scheduler.simulator import SimSource
from echo_scheduler.workloads import MODULUS, SyntheticStep, path_hash

FORMAT = "echo-trace/1"


@dataclass(frozen=True, slots=True)
class RecordedStep:
    """One logged decode step (see the module docstring)."""

    pool: TreeBatch  # everything drafted, BFS order per request
    target: Tensor  # [B, D] int64
    max_nodes: Tensor  # [B] int64
    requests: tuple[str, ...] | None = None  # [B] request ids, when the recording kept them
    request_steps: tuple[int, ...] | None = None  # [B] each request's decode step (1 = first)
    _index: _RecordIndex | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def index(self) -> _RecordIndex:
        """The recording's lookup tables, built on first use (a step is replayed many times)."""
        ix = self._index
        if ix is None:
            ix = _RecordIndex.of(self.pool)
            object.__setattr__(self, "_index", ix)
        return ix

    @property
    def batch_size(self) -> int:
        return self.pool.batch_size

    def reachable(self, width: int) -> Tensor:
        """Accepted draft length available in the recording, per request: [B] int64.

        ``width`` is ignored: a recording is as wide as it was drafted.
        """
        hit = accepted_mask(self.pool, self.target)
        return torch.bincount(self.pool.request_index()[hit], minlength=self.batch_size)

    def draft(self, pool: TreeBatch, plan: DraftPlan) -> Children:
        rec, ix = self.pool, self.index
        n, b = rec.num_nodes, self.batch_size
        if plan.root_topk is not None:
            slots = n + torch.arange(b)  # a root's children hang under slot N + b
            topk, parent = plan.root_topk, torch.full((b,), ROOT, dtype=torch.int64)
        else:
            found = ix.lookup(pool, plan.expand)
            ok = found >= 0
            slots, topk, parent = found[ok], plan.topk[ok], plan.expand[ok]
        # The first min(topk, recorded) children of each expanded slot, in expansion order.
        take = torch.minimum(topk, ix.child_count[slots])
        total = int(take.sum())
        within = torch.arange(total) - torch.repeat_interleave(take.cumsum(0) - take, take)
        order = ix.child_order[torch.repeat_interleave(ix.child_start[slots], take) + within]
        return Children(
            request=ix.req[order],
            parent=torch.repeat_interleave(parent, take),
            token=rec.token[order],
            draft_logprob=rec.draft_logprob[order],
        )


@dataclass(frozen=True, slots=True)
class _RecordIndex:
    """Per recorded node its request; per parent slot (a node, or ``N + r`` for request r's
    root) its children in rank order, as a CSR layout; and the recording's path keys sorted
    for lookup."""

    req: Tensor
    child_order: Tensor  # recorded nodes grouped by parent slot, each group in rank order
    child_start: Tensor  # [N + b]: where a slot's children begin in child_order
    child_count: Tensor  # [N + b]: how many children a slot has
    sorted_key: Tensor
    perm: Tensor

    @staticmethod
    def of(rec: TreeBatch) -> _RecordIndex:
        n, b = rec.num_nodes, rec.batch_size
        req, gp = rec.request_index(), rec.global_parent()
        rank = rank_in_group(torch.where(gp >= 0, gp + b, req), torch.arange(n))
        parent_slot = torch.where(gp >= 0, gp, n + req)
        child_order = torch.argsort(parent_slot * (n + 1) + rank)
        count = torch.bincount(parent_slot, minlength=n + b)
        key = req * MODULUS + path_hash(rec, torch.zeros(b, dtype=torch.int64))
        sorted_key, perm = torch.sort(key)
        return _RecordIndex(req, child_order, count.cumsum(0) - count, count, sorted_key, perm)

    def lookup(self, pool: TreeBatch, nodes: Tensor) -> Tensor:
        """Index in the recording of the node with the same request and token path as each of
        ``nodes`` (pool indices), -1 where the recording has none."""
        if self.perm.numel() == 0:
            return torch.full_like(nodes, -1)
        zero = torch.zeros(pool.batch_size, dtype=torch.int64)
        cur_key = (pool.request_index() * MODULUS + path_hash(pool, zero))[nodes]
        at = torch.searchsorted(self.sorted_key, cur_key).clamp(max=self.perm.numel() - 1)
        return torch.where(self.sorted_key[at] == cur_key, self.perm[at], -1)


def record(step: SyntheticStep, config: PolicyConfig) -> RecordedStep:
    """Record a synthetic step: draft every request to ``max_depth`` with the EAGLE-2 frontier
    (``topk`` nodes per depth, ``draft_width`` children each), no gating, no budget."""
    policy = GlobalTopKPolicy(config)
    caps = step.max_nodes.clamp(min=1)
    batch = StepBatch(batch_size=step.batch_size, budget=1, max_nodes=caps)
    pool = drive_step(policy, SimSource(step), batch, strict=True).pool
    return RecordedStep(pool=pool, target=step.target, max_nodes=step.max_nodes)


def save_trace(steps: Sequence[RecordedStep], path: str | Path) -> None:
    data = {
        "format": FORMAT,
        "steps": [
            {
                "cu_nodes": s.pool.cu_nodes.tolist(),
                "token": s.pool.token.tolist(),
                "parent": s.pool.parent.tolist(),
                "draft_logprob": [round(x, 6) for x in s.pool.draft_logprob.tolist()],
                "target": s.target.tolist(),
                "max_nodes": s.max_nodes.tolist(),
                **_origin(s),
            }
            for s in steps
        ],
    }
    text = json.dumps(data, separators=(",", ":")).encode("utf-8")
    p = Path(path)
    p.write_bytes(gzip.compress(text, mtime=0) if p.suffix == ".gz" else text)


def _origin(s: RecordedStep) -> dict[str, list[Any]]:
    if s.requests is None or s.request_steps is None:
        return {}
    return {"requests": list(s.requests), "request_steps": list(s.request_steps)}


def load_trace(path: str | Path) -> list[RecordedStep]:
    """The steps of an echo-trace/1 file (gzip-compressed when it ends in ``.gz``)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        data = json.loads(gzip.decompress(raw) if p.suffix == ".gz" else raw)
    except (OSError, EOFError, ValueError) as exc:  # unreadable, bad gzip, bad JSON
        raise TraceError(f"{path}: cannot read an {FORMAT} file: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f"{path}: not an {FORMAT} file")
    steps = data.get("steps")
    if not isinstance(steps, list):
        raise TraceError(f"{path}: 'steps' must be a list")
    return [_step(s, i) for i, s in enumerate(steps)]


def _step(s: dict[str, Any], i: int) -> RecordedStep:
    try:
        cu = s["cu_nodes"]
        nodes = [
            [
                (s["token"][j], s["parent"][j], s["draft_logprob"][j])
                for j in range(cu[b], cu[b + 1])
            ]
            for b in range(len(cu) - 1)
        ]
        pool = make_tree(nodes)
        target = torch.tensor(s["target"], dtype=torch.int64).view(pool.batch_size, -1)
        caps = torch.tensor(s["max_nodes"], dtype=torch.int64)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise TraceError(f"trace step {i}: {exc}") from exc
    if caps.shape != (pool.batch_size,):
        raise TraceError(f"trace step {i}: max_nodes needs {pool.batch_size} entries")
    requests, numbers = s.get("requests"), s.get("request_steps")
    if requests is None and numbers is None:
        return RecordedStep(pool=pool, target=target, max_nodes=caps)
    b = pool.batch_size
    if not (
        isinstance(requests, list)
        and isinstance(numbers, list)
        and len(requests) == len(numbers) == b
        and all(isinstance(r, str) for r in requests)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers)
    ):
        raise TraceError(
            f"trace step {i}: requests and request_steps must be {b} strings and {b} ints >= 1"
        )
    return RecordedStep(
        pool=pool,
        target=target,
        max_nodes=caps,
        requests=tuple(requests),
        request_steps=tuple(numbers),
    )
