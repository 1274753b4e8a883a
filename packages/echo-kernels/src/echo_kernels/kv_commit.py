"""KV commit after acceptance: extend each request's slot table, free the rejected rows' slots.

The verify pass stored the K/V of every verify row ``r`` in pool slot ``row_slots[r]``. After
acceptance, request ``b`` keeps its root row and its accepted nodes, in that order, right after
its cached prefix::

    req_to_slot[b, cache_len[b]]         = row_slots[root_row(b)]
    req_to_slot[b, cache_len[b] + 1 + j] = row_slots[root_row(b) + 1 + accepted_nodes[b, j]]
    new cache_len[b]                     = cache_len[b] + 1 + num_accepted[b]

Only the table changes: no KV is copied, because slots are token-granular. Every other verify
row's slot (the rejected nodes) is returned for the allocator to free. The bonus token is not
committed: it is next step's root, whose K/V the next verify pass computes.

Worked example: ``cache_len = [3]``, ``row_slots = [40, 41, 42, 43]`` (root, nodes 0-2),
accepted nodes ``[0, 2]``: ``req_to_slot[0, 3:6] = [40, 41, 43]``, new length 6, free ``[42]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.acceptance import PAD_NODE, AcceptResult
from echo_core.tree import TreeBatch
from echo_kernels.backend import Backend, use_triton

ACCEPT_BLOCK = 64
"""Accepted positions written together by one program of the commit kernel."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What the engine needs after a commit: new prefix lengths and the slots to free."""

    cache_len: Tensor  # [B] int64, cached tokens per request after the commit
    free_slots: Tensor  # [F] int64, slots of rejected rows, in verify-row order


def _check_inputs(
    req_to_slot: Tensor, cache_len: Tensor, row_slots: Tensor, tree: TreeBatch,
    result: AcceptResult,
) -> None:  # fmt: skip
    b, n = tree.batch_size, tree.num_nodes
    if req_to_slot.dim() != 2 or req_to_slot.shape[0] != b or req_to_slot.dtype != torch.int64:
        raise ValueError(
            f"req_to_slot must be [B={b}, max_ctx] int64, got "
            f"{tuple(req_to_slot.shape)} {req_to_slot.dtype}"
        )
    for name, t, size in (
        ("cache_len", cache_len, b),
        ("row_slots", row_slots, b + n),
        ("num_accepted", result.num_accepted, b),
    ):
        if t.shape != (size,) or t.dtype != torch.int64 or t.device != tree.device:
            raise ValueError(
                f"{name} must be [{size}] int64 on {tree.device}, got "
                f"{tuple(t.shape)} {t.dtype} on {t.device}"
            )
    if result.batch_size != b or req_to_slot.device != tree.device:
        raise ValueError(f"acceptance result has {result.batch_size} requests, tree has {b}")
    if not b:
        return
    # Value checks (one sync per step): they keep both backends' writes inside the table.
    width = result.accepted_nodes.shape[1]
    counts = tree.nodes_per_request()
    if bool((result.num_accepted < 0).any()) or bool((result.num_accepted > width).any()):
        raise ValueError(f"num_accepted out of [0, {width}]: {result.num_accepted.tolist()}")
    live = torch.arange(width, device=tree.device)[None, :] < result.num_accepted[:, None]
    nodes = result.accepted_nodes
    if bool((live & ((nodes < 0) | (nodes >= counts[:, None]))).any()):
        raise ValueError(f"accepted_nodes out of range of the tree: {nodes.tolist()}")
    max_ctx = req_to_slot.shape[1]
    new_len = cache_len + 1 + result.num_accepted
    if bool((cache_len < 0).any()) or int(new_len.max()) > max_ctx:
        raise ValueError(
            f"committing {new_len.tolist()} tokens overflows req_to_slot (max_ctx={max_ctx})"
        )


def commit_reference(
    req_to_slot: Tensor,  # [B, max_ctx] int64, updated in place
    cache_len: Tensor,  # [B] int64
    row_slots: Tensor,  # [B+N] int64
    tree: TreeBatch,
    result: AcceptResult,
) -> CommitResult:
    """Torch reference of the commit (module docstring), vectorised over the batch."""
    b, dev = tree.batch_size, tree.device
    root_rows = tree.cu_nodes[:-1] + torch.arange(b, device=dev)  # [B]
    nodes = result.accepted_nodes  # [B, L]
    live = nodes != PAD_NODE
    live &= torch.arange(nodes.shape[1], device=dev)[None, :] < result.num_accepted[:, None]
    rows = (root_rows[:, None] + 1 + nodes)[live]  # kept node rows, request-major, depth order
    cols = (cache_len[:, None] + 1 + torch.arange(nodes.shape[1], device=dev))[live]
    req = torch.arange(b, device=dev)[:, None].expand_as(nodes)[live]
    req_to_slot[torch.arange(b, device=dev), cache_len] = row_slots[root_rows]
    req_to_slot[req, cols] = row_slots[rows]
    keep = torch.zeros(row_slots.shape[0], dtype=torch.bool, device=dev)
    keep[root_rows] = True
    keep[rows] = True
    return CommitResult(cache_len + 1 + result.num_accepted, row_slots[~keep])


def commit_triton(
    req_to_slot: Tensor,  # [B, max_ctx] int64, rows contiguous, updated in place
    cache_len: Tensor,  # [B] int64, contiguous
    row_slots: Tensor,  # [B+N] int64, contiguous
    tree: TreeBatch,
    result: AcceptResult,
) -> CommitResult:
    """Launch the commit kernel after validating strides (shapes: see :func:`commit_kv`)."""
    if req_to_slot.stride(1) != 1 or not (cache_len.is_contiguous() and row_slots.is_contiguous()):
        raise ValueError("req_to_slot rows, cache_len and row_slots must be contiguous")
    nodes = result.accepted_nodes.contiguous()
    b = tree.batch_size
    keep = torch.zeros(row_slots.shape[0], dtype=torch.int8, device=row_slots.device)
    new_len = torch.empty_like(cache_len)
    if b:
        from echo_kernels.triton_kernels import kv_commit_kernel

        kv_commit_kernel[(b,)](
            req_to_slot, cache_len, row_slots, tree.cu_nodes.contiguous(), nodes,
            result.num_accepted.contiguous(), keep, new_len, req_to_slot.stride(0),
            nodes.shape[1], BLOCK=ACCEPT_BLOCK,
        )  # fmt: skip
    return CommitResult(new_len, row_slots[keep == 0])


def commit_kv(
    req_to_slot: Tensor,  # [B, max_ctx] int64, slot table of the batch, updated in place
    cache_len: Tensor,  # [B] int64, cached tokens per request before this step
    row_slots: Tensor,  # [B+N] int64, pool slot holding each verify row's K/V
    tree: TreeBatch,
    result: AcceptResult,
    *,
    backend: Backend = "auto",
) -> CommitResult:
    """Append the root and accepted nodes' slots to each request's table; return slots to free.

    Raises ValueError when the accepted nodes do not fit the tree or the table would overflow
    (checked for both backends: one host sync). ``backend``: see :mod:`echo_kernels.backend`.
    """
    _check_inputs(req_to_slot, cache_len, row_slots, tree, result)
    if use_triton(backend, tree.device):
        return commit_triton(req_to_slot, cache_len, row_slots, tree, result)
    return commit_reference(req_to_slot, cache_len, row_slots, tree, result)
