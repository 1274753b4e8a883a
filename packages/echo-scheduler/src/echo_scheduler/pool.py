"""Growing a candidate pool by one drafted depth, keeping the packed BFS order the policies expect.

The engine and the simulator both append a drafter's children with :func:`grow_pool`. Within each
request the result is ordered by depth, then parent, then the child's rank (the order the drafter
returned them in), so parents precede children and the existing nodes keep their request-local
indices: new nodes are deeper than every existing one and go after them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import ROOT, TreeBatch
from echo_scheduler.errors import TraceError
from echo_scheduler.ranking import positions


@dataclass(frozen=True, slots=True)
class Children:
    """Drafted children, grouped per expanded node in rank order (best first)."""

    request: Tensor  # [C] int64, the child's request
    parent: Tensor  # [C] int64, global index into the pool drafted from, ROOT for root children
    token: Tensor  # [C] int64
    draft_logprob: Tensor  # [C] float32, log q(token | ancestors)

    @property
    def count(self) -> int:
        return int(self.token.numel())


def grow_pool(pool: TreeBatch, children: Children) -> TreeBatch:
    """``pool`` with ``children`` appended, re-packed (see the module docstring)."""
    n, c = pool.num_nodes, children.count
    if c == 0:
        return pool
    dev = pool.device
    parent, req = children.parent, children.request
    if bool((parent >= n).any() | (parent < ROOT).any()):
        raise TraceError(f"child parents must index the pool of {n} nodes or be ROOT")
    has_parent = parent >= 0
    safe = torch.where(has_parent, parent, n)  # n: a padding slot standing for the root
    old_req = pool.request_index()
    pad_req = torch.cat([old_req, torch.full((1,), -1, dtype=torch.int64, device=dev)])
    if bool((has_parent & (pad_req[safe] != req)).any()):
        raise TraceError("a child's request differs from its parent's")
    # sort key: (request, old before new, old index | (parent, input order)); all unique.
    span = n + c + 1
    new_order = positions((parent + 1) * c + torch.arange(c, device=dev))
    key = torch.cat([old_req * span + torch.arange(n, device=dev), req * span + n + new_order])
    perm = torch.argsort(key)
    inverse = positions(key)  # new global index of every old (then new) node

    counts = pool.nodes_per_request() + torch.bincount(req, minlength=pool.batch_size)
    cu = torch.zeros_like(pool.cu_nodes)
    cu[1:] = torch.cumsum(counts, 0)
    parent_new_index = inverse[safe.clamp(max=max(n - 1, 0))]
    new_parent = torch.where(has_parent, parent_new_index - cu[:-1][req], ROOT)
    zero = torch.zeros(1, dtype=torch.float32, device=dev)
    depth = torch.cat([pool.depth, torch.zeros(1, dtype=torch.int64, device=dev)])[safe] + 1
    path = torch.cat([pool.path_logprob, zero])[safe] + children.draft_logprob.float()
    return TreeBatch(
        cu_nodes=cu,
        token=torch.cat([pool.token, children.token])[perm],
        parent=torch.cat([pool.parent, new_parent])[perm],
        depth=torch.cat([pool.depth, depth])[perm],
        draft_logprob=torch.cat([pool.draft_logprob, children.draft_logprob.float()])[perm],
        path_logprob=torch.cat([pool.path_logprob, path])[perm],
    )


def older_index(pool: TreeBatch, before: TreeBatch) -> Tensor:
    """Where each node of ``before`` sits in ``pool``, grown from it by :func:`grow_pool` (each
    request's older nodes first, in their order, then its new ones): ``i + cu_b - cu'_b`` for
    node i of request b (``cu``/``cu'``: ``pool``'s / ``before``'s node offsets). [N'] int64;
    fixed shape, no host sync (a mask ``depth < d`` would gather a count)."""
    shift = pool.cu_nodes[:-1] - before.cu_nodes[:-1]
    node = torch.arange(before.num_nodes, dtype=torch.int64, device=pool.device)
    return node + shift.index_select(0, before.request_index())
