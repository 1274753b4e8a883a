"""Commit a verify pass: keep the KV of each request's root and accepted path, free the rest.

A verify pass wrote K/V for every verify row (echo_core.verify_rows: per request its root, then
its nodes) into freshly allocated slots ``write_slots``. The root (last committed token) and the
accepted nodes extend the request's cache, in depth order; every other slot is freed. No K/V
moves: only the slot table changes. Example: nodes ``[a, b, c]`` with ``c`` a child of ``a`` and
path ``[a, c]`` accepted: the request keeps the slots of rows ``[root, a, c]`` and frees ``b``'s.

The rule is echo-kernels' :func:`~echo_kernels.kv_commit.commit_kv` (and its :func:`kept_rows`,
re-exported here), called through its backend dispatch on the pool's own slot table: the Triton
kernel when the pool lives on CUDA (and triton is installed), its torch reference on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_kernels import Backend, commit_kv, kept_rows
from echo_server.kv.pool import KVPool, RequestHandle

__all__ = ["commit_verified", "kept_rows"]


def commit_verified(
    pool: KVPool,
    handles: Sequence[RequestHandle],
    tree: TreeBatch,
    write_slots: Tensor,  # [B + N] int64, slot of every verify row
    accepted_nodes: Tensor,  # [B, L] int64, echo_core AcceptResult.accepted_nodes
    num_accepted: Tensor,  # [B] int64
    *,
    backend: Backend = "auto",
) -> None:
    """Append each request's root + accepted-node slots to its cache, free the others.

    Raises :class:`~echo_server.kv.errors.KVCapacityError` (before any write) when a request
    would pass the pool's ``max_context``; ``backend``: see :mod:`echo_kernels.backend`.
    """
    if write_slots.shape != (tree.batch_size + tree.num_nodes,):
        raise ValueError(
            f"write_slots must be [B + N = {tree.batch_size + tree.num_nodes}], "
            f"got {tuple(write_slots.shape)}"
        )
    if len(handles) != tree.batch_size:
        raise ValueError(f"{len(handles)} handles for a batch of {tree.batch_size}")
    counts = (num_accepted + 1).tolist()
    starts = pool.check_room(handles, counts)
    dev = pool.slot_table.device
    out = commit_kv(
        pool.slot_table,
        torch.tensor(starts, dtype=torch.int64, device=dev),
        write_slots.to(dev),
        tree.to(dev),
        accepted_nodes.to(dev),
        num_accepted.to(dev),
        req_rows=torch.tensor(list(handles), dtype=torch.int64, device=dev),
        backend=backend,
    )
    pool.grow(handles, counts)
    pool.free(out.free_slots)
