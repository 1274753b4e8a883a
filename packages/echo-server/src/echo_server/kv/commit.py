"""Commit a verify pass: keep the KV of each request's root and accepted path, free the rest.

A verify pass wrote K/V for every verify row (echo_core.verify_rows: per request its root, then
its nodes) into freshly allocated slots ``write_slots``. The root (last committed token) and the
accepted nodes extend the request's cache, in depth order; every other slot is freed. No K/V
moves: only the slot table changes. Because parents precede children, an accepted path is in
increasing row order, so "rows kept, in row order" is already "root, then path by depth".
Example: nodes ``[a, b, c]`` with ``c`` a child of ``a`` and path ``[a, c]`` accepted: the
request keeps the slots of rows ``[root, a, c]`` and frees ``b``'s.

echo-kernels may provide a fused commit with the same contract; this is the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_core.verify_rows import root_rows
from echo_server.kv.pool import KVPool, RequestHandle


def kept_rows(
    tree: TreeBatch,
    accepted_nodes: Tensor,  # [B, L] int64 request-local node ids in depth order, padded
    num_accepted: Tensor,  # [B] int64
) -> Tensor:
    """Verify rows whose KV is kept: [B + N] bool (roots and accepted nodes)."""
    keep = torch.zeros(tree.batch_size + tree.num_nodes, dtype=torch.bool, device=tree.device)
    keep[root_rows(tree)] = True
    width = accepted_nodes.shape[1]
    valid = torch.arange(width, device=tree.device)[None, :] < num_accepted[:, None]  # [B, L]
    # Node-local id i of request b sits at verify row cu_nodes[b] + b + 1 + i.
    base = tree.cu_nodes[:-1] + torch.arange(tree.batch_size, device=tree.device) + 1  # [B]
    rows = base[:, None] + accepted_nodes.clamp(min=0)
    keep[rows[valid]] = True
    return keep


def commit_verified(
    pool: KVPool,
    handles: Sequence[RequestHandle],
    tree: TreeBatch,
    write_slots: Tensor,  # [B + N] int64, slot of every verify row
    accepted_nodes: Tensor,  # [B, L] int64, echo_core AcceptResult.accepted_nodes
    num_accepted: Tensor,  # [B] int64
) -> None:
    """Append each request's root + accepted-node slots to its cache, free the others."""
    if write_slots.shape != (tree.batch_size + tree.num_nodes,):
        raise ValueError(
            f"write_slots must be [B + N = {tree.batch_size + tree.num_nodes}], "
            f"got {tuple(write_slots.shape)}"
        )
    if len(handles) != tree.batch_size:
        raise ValueError(f"{len(handles)} handles for a batch of {tree.batch_size}")
    keep = kept_rows(tree, accepted_nodes, num_accepted)
    counts = (num_accepted + 1).tolist()
    pool.append(handles, write_slots[keep], counts)
    pool.free(write_slots[~keep])
