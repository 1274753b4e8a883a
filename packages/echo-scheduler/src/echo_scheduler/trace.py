"""Recorded traces: what the engine logs per step, replayed as a drafter for any policy.

A recorded step holds the step's full candidate pool (every node the drafter produced, drafted
wide and deep enough for the policies to be replayed), the target's greedy continuation
``target`` ([B, D]; a node is accepted iff its token path equals the continuation's prefix) and
the per-request caps. Replaying: a policy's expansion of node f returns the first ``topk``
recorded children of the recorded node with f's token path (children in recorded rank order);
expansions beyond the recording return what was recorded (fewer children, or none).

File format (JSON, ``"format": "echo-trace/1"``): ``steps`` is a list of objects with
``cu_nodes``, ``token``, ``parent`` (request-local), ``draft_logprob``, ``target`` (list of B
lists) and ``max_nodes``; depths and path log-probs are derived on load.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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
        rec = self.pool
        b = self.batch_size
        req = rec.request_index()
        gp = rec.global_parent()
        rank = rank_in_group(torch.where(gp >= 0, gp + b, req), torch.arange(rec.num_nodes))
        slot = torch.full((rec.num_nodes + b,), -1, dtype=torch.int64)  # expansion per parent
        topk = torch.zeros(rec.num_nodes + b, dtype=torch.int64)
        current = torch.full((rec.num_nodes + b,), ROOT, dtype=torch.int64)
        if plan.root_topk is not None:
            roots = torch.arange(b)
            slot[rec.num_nodes + roots], topk[rec.num_nodes + roots] = roots, plan.root_topk
        else:
            found = _lookup(rec, pool, plan.expand)
            ok = found >= 0
            slot[found[ok]] = torch.arange(plan.expand.numel())[ok]
            topk[found[ok]] = plan.topk[ok]
            current[found[ok]] = plan.expand[ok]
        parent_slot = torch.where(gp >= 0, gp, rec.num_nodes + req)
        take = (slot[parent_slot] >= 0) & (rank < topk[parent_slot])
        idx = take.nonzero().squeeze(1)
        order = idx[torch.argsort(slot[parent_slot[idx]] * (rec.num_nodes + 1) + rank[idx])]
        return Children(
            request=req[order],
            parent=current[parent_slot[order]],
            token=rec.token[order],
            draft_logprob=rec.draft_logprob[order],
        )


def _lookup(rec: TreeBatch, pool: TreeBatch, nodes: Tensor) -> Tensor:
    """Index in ``rec`` of the node with the same request and token path as each of ``nodes``."""
    zero = torch.zeros(rec.batch_size, dtype=torch.int64)
    rec_key = rec.request_index() * MODULUS + path_hash(rec, zero)
    cur_key = (pool.request_index() * MODULUS + path_hash(pool, zero))[nodes]
    sorted_key, perm = torch.sort(rec_key)
    at = torch.searchsorted(sorted_key, cur_key).clamp(max=max(rec.num_nodes - 1, 0))
    if rec.num_nodes == 0:
        return torch.full_like(nodes, -1)
    return torch.where(sorted_key[at] == cur_key, perm[at], -1)


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
            }
            for s in steps
        ],
    }
    Path(path).write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")


def load_trace(path: str | Path) -> list[RecordedStep]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f"{path}: not an {FORMAT} file")
    return [_step(s, i) for i, s in enumerate(data["steps"])]


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
    return RecordedStep(pool=pool, target=target, max_nodes=caps)
