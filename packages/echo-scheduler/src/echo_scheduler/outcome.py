"""What greedy verification accepts, and the oracle bound the simulator compares against.

Greedy acceptance with a known target continuation ``t_1..t_D`` (per request): a node at depth d
is accepted iff its parent is accepted (or is the root) and its token equals ``t_d``; the accepted
nodes of a request form one root path, whose length is the request's accepted draft length (plus
one bonus token, always emitted).

Oracle (hindsight-best use of the same budget on the same drafter). Per request the accepted path
is known; let ``L_b`` be the longest prefix of it the drafter can produce at all (every target
token is among the drafter's candidates). Every accepted node is worth exactly one token and every
other node nothing, so the best selection takes only accepted-path nodes, in any order across the
batch (greedily by value, all values being 1), giving
``oracle(K) = min(K, sum_b min(L_b, max_nodes[b]))`` accepted tokens with exactly as many verified.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_scheduler.ranking import depth_groups


def accepted_mask(pool: TreeBatch, target: Tensor) -> Tensor:
    """[N] bool: nodes on the target's path. ``target``: [B, D] int64; deeper nodes never match."""
    ok = torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
    req = pool.request_index()
    gp = pool.global_parent()
    for d, idx in enumerate(depth_groups(pool), start=1):
        if d > target.shape[1]:
            break
        match = pool.token[idx] == target[req[idx], d - 1]
        ok[idx] = match if d == 1 else match & ok[gp[idx]]
    return ok


def accepted_lengths(pool: TreeBatch, keep: Tensor, target: Tensor) -> Tensor:
    """Accepted draft tokens per request when ``keep`` ([N] bool, ancestor-closed) is verified."""
    hit = keep & accepted_mask(pool, target)
    return torch.bincount(pool.request_index()[hit], minlength=pool.batch_size)


def oracle_accepted(reachable: Tensor, max_nodes: Tensor, budget: int) -> int:
    """``min(K, sum_b min(L_b, max_nodes[b]))`` (module docstring); ``reachable`` = L: [B]."""
    return min(budget, int(torch.minimum(reachable, max_nodes).sum()))
