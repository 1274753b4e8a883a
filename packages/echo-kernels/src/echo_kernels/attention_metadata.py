"""Per-step metadata of ragged tree attention: which keys every packed query row may see.

The query rows of one attention call are packed over the batch: request ``b`` owns rows
``cu_rows[b]:cu_rows[b+1]`` (its *new* rows, whose K/V this forward pass computes). Row ``r`` of
request ``b`` attends to

1. the request's cached prefix: pool slots ``req_to_slot[b, 0:cache_len[b]]``, cached token ``j``
   sitting at position ``j`` (token-granular slots, as SGLang's ``req_to_token``);
2. the request's new rows that its mask allows, where a *local row* ``c`` is
   ``r' - cu_rows[b]`` for a row ``r'`` of the same request:

   - tree requests (``causal[b]`` false): local row ``c`` is visible iff bit ``c % 32`` of word
     ``c // 32`` of ``tree_bits[r]`` is set;
   - causal requests (``causal[b]`` true): local rows ``c <= r - cu_rows[b]`` (prefill, or any
     chain), ``tree_bits`` ignored.

With a sliding window ``w`` a key at position ``k`` stays visible only while
``positions[r] - k < w``.

Verify (one decode step, :func:`verify_metadata`): rows are echo-core's verify rows, root first
then the nodes, so local row 0 is the root (visible to every row of its request) and local row
``1 + j`` is node ``j``, visible to node ``i`` iff ``j`` is ``i`` or one of its ancestors.
Parents precede children, so every visible local row is ``<=`` the query's own local row: the
kernel never looks past the block's last row. A zero-node request is one root row.

Prefill (:func:`prefill_metadata`): ``n_b`` new prompt tokens per request, causal; a chain tree
built with :func:`verify_metadata` gives exactly the same attention (tested), so a mixed batch
(some requests prefilling, others verifying) is one metadata object with both kinds of rows,
``tree_bits`` wide enough for the tree requests only.

Build the metadata once per step and pass it to every layer's attention call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.layouts import BITS_PER_WORD, ancestor_mask, pack_bits, verify_positions
from echo_core.tree import TreeBatch
from echo_core.verify_rows import node_rows, verify_offsets


@dataclass(frozen=True, slots=True)
class TreeAttentionMetadata:
    """Row layout and visibility of one ragged attention call (see the module docstring)."""

    cu_rows: Tensor  # [B+1] int64, row offsets of the packed queries, cu_rows[0] == 0
    positions: Tensor  # [R] int64, absolute position of every row
    cache_len: Tensor  # [B] int64, cached prefix tokens per request
    req_to_slot: Tensor  # [B, max_ctx] int64, pool slot of cached token j (j < cache_len[b])
    tree_bits: Tensor  # [R, W] int32, row r sees local row c iff bit c%32 of word c//32 is set
    causal: Tensor  # [B] bool, True: causal chain (tree_bits ignored for the request)
    max_rows: int  # largest rows-per-request (host int: sizes the kernel grid)

    @property
    def batch_size(self) -> int:
        return int(self.cu_rows.numel()) - 1

    @property
    def num_rows(self) -> int:
        return int(self.positions.numel())

    @property
    def device(self) -> torch.device:
        return self.cu_rows.device

    def validate(self) -> None:
        """Check shapes, dtypes and values; raise ValueError naming the first violation.

        Syncs with the device (value checks): call it when building metadata, not per layer.
        """
        b, r = self.batch_size, self.num_rows
        expect = {
            "cu_rows": (self.cu_rows, torch.int64, 1),
            "positions": (self.positions, torch.int64, 1),
            "cache_len": (self.cache_len, torch.int64, 1),
            "req_to_slot": (self.req_to_slot, torch.int64, 2),
            "tree_bits": (self.tree_bits, torch.int32, 2),
            "causal": (self.causal, torch.bool, 1),
        }
        for name, (t, dtype, ndim) in expect.items():
            if t.dtype != dtype or t.dim() != ndim:
                raise ValueError(f"{name} must be {ndim}-D {dtype}, got {tuple(t.shape)} {t.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name} is on {t.device}, cu_rows on {self.device}")
        if b < 0 or self.cache_len.shape != (b,) or self.causal.shape != (b,):
            raise ValueError(
                f"cache_len and causal must be [B={b}], got {tuple(self.cache_len.shape)} "
                f"and {tuple(self.causal.shape)}"
            )
        if self.req_to_slot.shape[0] != b or self.tree_bits.shape[0] != r:
            raise ValueError(
                f"req_to_slot must be [B={b}, max_ctx] and tree_bits [R={r}, W], got "
                f"{tuple(self.req_to_slot.shape)} and {tuple(self.tree_bits.shape)}"
            )
        counts = self.cu_rows[1:] - self.cu_rows[:-1]
        if int(self.cu_rows[0]) != 0 or int(self.cu_rows[-1]) != r or bool((counts < 0).any()):
            raise ValueError(f"cu_rows must rise from 0 to R={r}, got {self.cu_rows.tolist()}")
        actual_max = int(counts.max()) if b else 0
        if self.max_rows != actual_max:
            raise ValueError(f"max_rows={self.max_rows} but the largest request has {actual_max}")
        max_ctx = self.req_to_slot.shape[1]
        if b and (bool((self.cache_len < 0).any()) or int(self.cache_len.max()) > max_ctx):
            raise ValueError(
                f"cache_len must be in [0, max_ctx={max_ctx}], got {self.cache_len.tolist()}"
            )
        tree_rows = counts[~self.causal]
        capacity = BITS_PER_WORD * self.tree_bits.shape[1]
        if tree_rows.numel() and int(tree_rows.max()) > capacity:
            raise ValueError(
                f"a tree request has {int(tree_rows.max())} rows but tree_bits holds "
                f"{capacity} columns"
            )


def verify_metadata(
    tree: TreeBatch,
    cache_len: Tensor,  # [B] int64, tokens already cached per request (the root is not)
    req_to_slot: Tensor,  # [B, max_ctx] int64, pool slots of the cached tokens
) -> TreeAttentionMetadata:
    """Metadata of the verify pass over ``tree`` (echo-core verify-row order, root first)."""
    b, n = tree.batch_size, tree.num_nodes
    width = int(tree.nodes_per_request().max()) + 1 if b else 0
    visible = torch.zeros(b + n, width, dtype=torch.bool, device=tree.device)  # [R, max_rows]
    if b:
        visible[:, 0] = True  # every row sees its request's root
        visible[node_rows(tree), 1:] = ancestor_mask(tree)
    meta = TreeAttentionMetadata(
        cu_rows=verify_offsets(tree),
        positions=verify_positions(tree, cache_len),
        cache_len=cache_len.to(torch.int64),
        req_to_slot=req_to_slot,
        tree_bits=pack_bits(visible),
        causal=torch.zeros(b, dtype=torch.bool, device=tree.device),
        max_rows=width,
    )
    meta.validate()
    return meta


def prefill_metadata(
    num_rows: Tensor,  # [B] int64, new (uncached) tokens per request, >= 0
    cache_len: Tensor,  # [B] int64, tokens already cached per request
    req_to_slot: Tensor,  # [B, max_ctx] int64, pool slots of the cached tokens
) -> TreeAttentionMetadata:
    """Metadata of a causal pass: request b's rows sit at positions ``cache_len[b] + i``."""
    b = int(num_rows.numel())
    if num_rows.shape != (b,) or (b and bool((num_rows < 0).any())):
        raise ValueError(f"num_rows must be a [B] tensor of counts >= 0, got {num_rows.tolist()}")
    dev = num_rows.device
    counts = num_rows.to(torch.int64)
    cu = torch.zeros(b + 1, dtype=torch.int64, device=dev)
    cu[1:] = torch.cumsum(counts, 0)
    r = int(cu[-1])
    req = torch.repeat_interleave(torch.arange(b, device=dev), counts)  # [R]
    local = torch.arange(r, device=dev) - cu[:-1][req]
    meta = TreeAttentionMetadata(
        cu_rows=cu,
        positions=cache_len.to(torch.int64)[req] + local,
        cache_len=cache_len.to(torch.int64),
        req_to_slot=req_to_slot,
        tree_bits=torch.zeros(r, 0, dtype=torch.int32, device=dev),
        causal=torch.ones(b, dtype=torch.bool, device=dev),
        max_rows=int(counts.max()) if b else 0,
    )
    meta.validate()
    return meta
