"""KV commit after acceptance: extend each request's slot table, free the rejected rows' slots.

The verify pass stored the K/V of every verify row ``r`` in pool slot ``row_slots[r]``. After
acceptance, request ``b`` (table row ``t = req_rows[b]``) keeps its root row and its accepted
nodes, in that order, right after its cached prefix::

    req_to_slot[t, cache_len[b]]         = row_slots[root_row(b)]
    req_to_slot[t, cache_len[b] + 1 + j] = row_slots[root_row(b) + 1 + accepted_nodes[b, j]]
    new cache_len[b]                     = cache_len[b] + 1 + num_accepted[b]

Only the table changes: no KV is copied, because slots are token-granular. Every other verify
row's slot (the rejected nodes) is returned for the allocator to free, in verify-row order
(:func:`kept_rows` is the complement). The bonus token is not committed: it is next step's root,
whose K/V the next verify pass computes. ``req_rows`` lets the table be a whole pool's slot
table (one row per admitted request, e.g. echo-server's ``KVPool.slot_table``); without it
``req_to_slot`` is the batch's own ``[B, max_ctx]`` table and ``t = b``.

Worked example: ``cache_len = [3]``, ``row_slots = [40, 41, 42, 43]`` (root, nodes 0-2),
accepted nodes ``[0, 2]``: ``req_to_slot[0, 3:6] = [40, 41, 43]``, new length 6, free ``[42]``.

:func:`commit_reference` is the one torch definition of this rule (echo-core, the home of the
acceptance references, has no KV); the Triton kernel is tested against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_core.verify_rows import root_rows
from echo_kernels.backend import Backend, use_triton

ACCEPT_BLOCK = 64
"""Accepted positions written together by one program of the commit kernel."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What the engine needs after a commit: new prefix lengths and the slots to free."""

    cache_len: Tensor  # [B] int64, cached tokens per request after the commit
    free_slots: Tensor  # [F] int64, slots of rejected rows, in verify-row order


def kept_rows(
    tree: TreeBatch,
    accepted_nodes: Tensor,  # [B, L] int64 request-local node ids in depth order, padded
    num_accepted: Tensor,  # [B] int64
) -> Tensor:
    """Verify rows whose K/V a commit keeps: [B + N] bool, every root and its accepted nodes."""
    dev = tree.device
    roots = root_rows(tree)
    keep = torch.zeros(tree.batch_size + tree.num_nodes, dtype=torch.bool, device=dev)
    keep[roots] = True
    width = accepted_nodes.shape[1]
    live = torch.arange(width, device=dev)[None, :] < num_accepted[:, None]  # [B, L]
    # Request-local node i of request b sits at verify row root_row(b) + 1 + i.
    keep[(roots[:, None] + 1 + accepted_nodes.clamp(min=0))[live]] = True
    return keep


def _check_inputs(
    req_to_slot: Tensor, req_rows: Tensor | None, cache_len: Tensor, row_slots: Tensor,
    tree: TreeBatch, accepted_nodes: Tensor, num_accepted: Tensor,
) -> None:  # fmt: skip
    b, n = tree.batch_size, tree.num_nodes
    if req_to_slot.dim() != 2 or req_to_slot.dtype != torch.int64:
        raise ValueError(
            f"req_to_slot must be [rows, max_ctx] int64, got "
            f"{tuple(req_to_slot.shape)} {req_to_slot.dtype}"
        )
    if req_rows is None and req_to_slot.shape[0] != b:
        raise ValueError(
            f"req_to_slot must be [B={b}, max_ctx] without req_rows, got {tuple(req_to_slot.shape)}"
        )
    named = [("cache_len", cache_len, b), ("row_slots", row_slots, b + n)]
    named += [("num_accepted", num_accepted, b)]
    if req_rows is not None:
        named.append(("req_rows", req_rows, b))
    for name, t, size in named:
        if t.shape != (size,) or t.dtype != torch.int64 or t.device != tree.device:
            raise ValueError(
                f"{name} must be [{size}] int64 on {tree.device}, got "
                f"{tuple(t.shape)} {t.dtype} on {t.device}"
            )
    if accepted_nodes.dim() != 2 or accepted_nodes.shape[0] != b:
        raise ValueError(f"accepted_nodes must be [B={b}, L], got {tuple(accepted_nodes.shape)}")
    if accepted_nodes.dtype != torch.int64 or accepted_nodes.device != tree.device:
        raise ValueError(f"accepted_nodes must be int64 on {tree.device}")
    if req_to_slot.device != tree.device:
        raise ValueError(f"req_to_slot is on {req_to_slot.device}, the tree on {tree.device}")
    if not b:
        return
    # Value checks (host syncs): they keep both backends' writes inside the table.
    width = accepted_nodes.shape[1]
    counts = tree.nodes_per_request()
    if bool((num_accepted < 0).any()) or bool((num_accepted > width).any()):
        raise ValueError(f"num_accepted out of [0, {width}]: {num_accepted.tolist()}")
    live = torch.arange(width, device=tree.device)[None, :] < num_accepted[:, None]
    nodes = accepted_nodes
    if bool((live & ((nodes < 0) | (nodes >= counts[:, None]))).any()):
        raise ValueError(f"accepted_nodes out of range of the tree: {nodes.tolist()}")
    if req_rows is not None:
        rows = req_rows.sort().values
        if int(rows[0]) < 0 or int(rows[-1]) >= req_to_slot.shape[0]:
            raise ValueError(f"req_rows out of [0, {req_to_slot.shape[0]}): {req_rows.tolist()}")
        if bool((rows[1:] == rows[:-1]).any()):
            raise ValueError(f"req_rows must be distinct, got {req_rows.tolist()}")
    max_ctx = req_to_slot.shape[1]
    new_len = cache_len + 1 + num_accepted
    if bool((cache_len < 0).any()) or int(new_len.max()) > max_ctx:
        raise ValueError(
            f"committing {new_len.tolist()} tokens overflows req_to_slot (max_ctx={max_ctx})"
        )


def commit_reference(
    req_to_slot: Tensor,  # [rows, max_ctx] int64, updated in place
    req_rows: Tensor,  # [B] int64, distinct table row of each request
    cache_len: Tensor,  # [B] int64
    row_slots: Tensor,  # [B+N] int64
    tree: TreeBatch,
    accepted_nodes: Tensor,  # [B, L] int64
    num_accepted: Tensor,  # [B] int64
) -> CommitResult:
    """Torch reference of the commit (module docstring), vectorised over the batch."""
    dev = tree.device
    roots = root_rows(tree)  # [B]
    j = torch.arange(accepted_nodes.shape[1], device=dev)
    live = j[None, :] < num_accepted[:, None]  # [B, L]
    rows = (roots[:, None] + 1 + accepted_nodes)[live]  # kept node rows, request-major, by depth
    cols = (cache_len[:, None] + 1 + j)[live]
    req_to_slot[req_rows, cache_len] = row_slots[roots]
    req_to_slot[req_rows[:, None].expand_as(accepted_nodes)[live], cols] = row_slots[rows]
    keep = kept_rows(tree, accepted_nodes, num_accepted)
    return CommitResult(cache_len + 1 + num_accepted, row_slots[~keep])


def commit_triton(
    req_to_slot: Tensor,  # [rows, max_ctx] int64, rows contiguous, updated in place
    req_rows: Tensor,  # [B] int64, distinct
    cache_len: Tensor,  # [B] int64
    row_slots: Tensor,  # [B+N] int64
    tree: TreeBatch,
    accepted_nodes: Tensor,  # [B, L] int64
    num_accepted: Tensor,  # [B] int64
) -> CommitResult:
    """Launch the commit kernel after validating strides (shapes: see :func:`commit_kv`)."""
    if req_to_slot.stride(1) != 1 or not (cache_len.is_contiguous() and row_slots.is_contiguous()):
        raise ValueError("req_to_slot rows, cache_len and row_slots must be contiguous")
    nodes = accepted_nodes.contiguous()
    b = tree.batch_size
    keep = torch.zeros(row_slots.shape[0], dtype=torch.int8, device=row_slots.device)
    new_len = torch.empty_like(cache_len)
    if b:
        from echo_kernels.triton_kernels import kv_commit_kernel

        kv_commit_kernel[(b,)](
            req_to_slot, req_rows.contiguous(), cache_len, row_slots, tree.cu_nodes.contiguous(),
            nodes, num_accepted.contiguous(), keep, new_len, req_to_slot.stride(0),
            nodes.shape[1], BLOCK=ACCEPT_BLOCK,
        )  # fmt: skip
    return CommitResult(new_len, row_slots[keep == 0])


def commit_kv(
    req_to_slot: Tensor,  # [rows, max_ctx] int64, slot table, updated in place
    cache_len: Tensor,  # [B] int64, cached tokens per request before this step
    row_slots: Tensor,  # [B+N] int64, pool slot holding each verify row's K/V
    tree: TreeBatch,
    accepted_nodes: Tensor,  # [B, L] int64, AcceptResult.accepted_nodes
    num_accepted: Tensor,  # [B] int64, AcceptResult.num_accepted
    *,
    req_rows: Tensor | None = None,  # [B] int64 table row per request; None = row b
    backend: Backend = "auto",
) -> CommitResult:
    """Append the root and accepted nodes' slots to each request's table; return slots to free.

    Every tensor lives on the tree's device. Raises ValueError when the accepted nodes do not
    fit the tree, ``req_rows`` repeats or leaves the table, or a row would overflow (checked for
    both backends: host syncs). ``backend``: see :mod:`echo_kernels.backend`.
    """
    _check_inputs(req_to_slot, req_rows, cache_len, row_slots, tree, accepted_nodes, num_accepted)
    if req_rows is None:
        req_rows = torch.arange(tree.batch_size, device=tree.device)
    args = (req_to_slot, req_rows, cache_len, row_slots, tree, accepted_nodes, num_accepted)
    if use_triton(backend, tree.device):
        return commit_triton(*args)
    return commit_reference(*args)
