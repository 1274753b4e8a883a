"""The attention seam: what one forward attends to, and the backend Protocol that computes it.

A forward runs ``R`` packed new rows for ``B`` requests (request b owns rows
``cu_rows[b]:cu_rows[b+1]``). Before attention the model writes each new row's K/V into the KV
pool at ``write_slots[row]``. Row r of request b then attends to

- its cached prefix: the ``cache_len[b]`` slots ``slot_table[req_rows[b], :cache_len[b]]``, all
  visible;
- the request's new rows, by ``new_mask[r, j]`` (j = request-local new row); ``new_mask=None``
  means causal (``j <= r_local``): prefill, chunked prefill and plain decoding.

For tree verification the new rows are the root then the nodes (echo_core.verify_rows) and
:func:`tree_row_mask` gives the mask: root sees itself, a node sees the root and its ancestors.

Backends implement :class:`AttentionBackend`: ``plan`` once per forward (index and mask layout
shared by all layers), ``attend`` once per layer. Two implementations:
:class:`echo_server.model.torch_attention.TorchAttention` (batched SDPA, the CPU default) and
:class:`echo_server.model.kernels_attention.KernelsAttention` (echo-kernels' ``tree_attention``:
Triton on CUDA, its torch reference on CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from echo_core.layouts import ancestor_mask
from echo_core.tree import TreeBatch
from echo_core.verify_rows import node_rows, root_rows

PlanT = TypeVar("PlanT")

NULL_SLOT = 0
"""KV pool slot that is never allocated: padded context columns read it, harmlessly."""


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    """Attention metadata of one forward (module docstring); build with :func:`make_batch`."""

    cu_rows: Tensor  # [B+1] int64, packed new-row offsets per request
    cache_len: Tensor  # [B] int64, cached prefix length per request
    req_rows: Tensor  # [B] int64, each request's row in slot_table
    slot_table: Tensor  # [max_requests, max_context] int64, request-to-slot table of the pool
    write_slots: Tensor  # [R] int64, pool slot receiving each new row's K/V
    new_mask: Tensor | None  # [R, W] bool, W = max_rows; None = causal among new rows
    rows_host: tuple[int, ...]  # new rows per request, host copy of diff(cu_rows)
    cache_len_host: tuple[int, ...]  # host copy of cache_len

    @property
    def batch_size(self) -> int:
        return len(self.rows_host)

    @property
    def num_rows(self) -> int:
        return int(self.write_slots.numel())

    @property
    def max_rows(self) -> int:
        """W: most new rows of one request."""
        return max(self.rows_host, default=0)

    @property
    def max_context(self) -> int:
        """Longest attended context, ``max_b cache_len[b] + rows[b]``."""
        return max(
            (c + r for c, r in zip(self.cache_len_host, self.rows_host, strict=True)), default=0
        )


def make_batch(
    slot_table: Tensor,  # [max_requests, max_context] int64
    req_rows: Sequence[int],
    cache_lens: Sequence[int],
    rows: Sequence[int],
    write_slots: Tensor,  # [sum(rows)] int64
    new_mask: Tensor | None = None,  # [sum(rows), max(rows)] bool
) -> AttentionBatch:
    """Validate and pack attention metadata; raises ValueError naming the bad input."""
    if not len(req_rows) == len(cache_lens) == len(rows):
        raise ValueError(
            f"req_rows, cache_lens, rows differ in length: {len(req_rows)}, "
            f"{len(cache_lens)}, {len(rows)}"
        )
    if any(r < 0 for r in rows) or any(c < 0 for c in cache_lens):
        raise ValueError(f"rows {list(rows)} and cache_lens {list(cache_lens)} must be >= 0")
    total = sum(rows)
    if write_slots.shape != (total,) or write_slots.dtype != torch.int64:
        raise ValueError(
            f"write_slots must be [{total}] int64, got {tuple(write_slots.shape)} "
            f"{write_slots.dtype}"
        )
    width = slot_table.shape[1]
    longest = max((c + r for c, r in zip(cache_lens, rows, strict=True)), default=0)
    if longest > width:
        raise ValueError(f"a request reaches context {longest} > slot table width {width}")
    if new_mask is not None and (
        new_mask.dtype != torch.bool or new_mask.shape != (total, max(rows, default=0))
    ):
        raise ValueError(
            f"new_mask must be [{total}, {max(rows, default=0)}] bool, got "
            f"{tuple(new_mask.shape)} {new_mask.dtype}"
        )
    dev = slot_table.device
    cu = torch.zeros(len(rows) + 1, dtype=torch.int64, device=dev)
    cu[1:] = torch.cumsum(torch.tensor(rows, dtype=torch.int64, device=dev), 0)
    return AttentionBatch(
        cu_rows=cu.to(dev),
        cache_len=torch.tensor(list(cache_lens), dtype=torch.int64, device=dev),
        req_rows=torch.tensor(list(req_rows), dtype=torch.int64, device=dev),
        slot_table=slot_table,
        write_slots=write_slots,
        new_mask=new_mask,
        rows_host=tuple(int(r) for r in rows),
        cache_len_host=tuple(int(c) for c in cache_lens),
    )


def ragged_positions(batch: AttentionBatch) -> Tensor:
    """Positions of causal new rows, ``cache_len[b] + local row``: [R] int64 (prefill, decode).

    Tree verification uses ``echo_core.layouts.verify_positions`` instead (siblings share one).
    """
    rows = torch.tensor(batch.rows_host, dtype=torch.int64, device=batch.cu_rows.device)
    req = torch.repeat_interleave(torch.arange(batch.batch_size, device=rows.device), rows)
    local = torch.arange(batch.num_rows, device=rows.device) - batch.cu_rows[:-1][req]
    return batch.cache_len[req] + local


def tree_row_mask(tree: TreeBatch) -> Tensor:
    """New-row mask of a verify pass: [B + N, max_nodes + 1] bool in verify-row order.

    Column 0 is the request's root row, column ``1 + j`` its node j. The root row sees only
    itself; node i sees the root and its ancestors-or-self (``echo_core.layouts.ancestor_mask``).
    Example: a chain root -> a -> b gives rows ``[1,0,0], [1,1,0], [1,1,1]``.
    """
    anc = ancestor_mask(tree)  # [N, max_nodes]
    width = anc.shape[1] + 1
    mask = torch.zeros(
        tree.batch_size + tree.num_nodes, width, dtype=torch.bool, device=tree.device
    )
    mask[root_rows(tree), 0] = True
    rows = node_rows(tree)
    mask[rows, 0] = True
    mask[rows, 1:] = anc
    return mask


class AttentionBackend(Protocol[PlanT]):
    """Computes attention over the KV pool for the rows of an :class:`AttentionBatch`."""

    def plan(self, batch: AttentionBatch) -> PlanT:
        """Per-forward preparation shared by every layer (index layouts, masks)."""
        ...

    def attend(
        self,
        plan: PlanT,
        q: Tensor,  # [R, H, D] model dtype, RoPE applied
        k_new: Tensor,  # [R, Hkv, D] keys of the new rows (RoPE applied), also in k_cache
        v_new: Tensor,  # [R, Hkv, D] values of the new rows, also in v_cache
        k_cache: Tensor,  # [S, Hkv, D] this layer's pool keys, new rows already written
        v_cache: Tensor,  # [S, Hkv, D]
        scale: float,
    ) -> Tensor:
        """Attention output per row: [R, H, D] in q's dtype.

        The new rows' K/V are given twice (fresh, and in the pool at ``write_slots``) so that a
        kernel may read either; the torch reference reads everything from the pool.
        """
        ...
