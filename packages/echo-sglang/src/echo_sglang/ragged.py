"""Phase 2, ragged: verify only the real rows, packed, with ragged query and mask offsets.

The padded layout computes ``B T`` rows whatever the budget; under ECHO most requests hold far
fewer than ``T - 1`` nodes, so the target forward should run over ``R = sum_b (n_b + 1)`` rows.
The ragged layout packs request b's root and nodes at rows ``qo_indptr[b]:qo_indptr[b+1]``
(echo-core's verify-row order, so echo-kernels' ``verify_metadata`` describes the same rows) and
gives what ragged attention kernels take:

- ``qo_indptr`` [B+1]: query offsets (FlashInfer ``qo_indptr``, SGLang Triton ``qo_indptr``);
- ``custom_mask`` / ``mask_indptr``: FULL_MASK blocks ``[q_b, p_b + q_b]`` with ``q_b = n_b + 1``
  (:func:`~echo_sglang.masks.full_mask`);
- ``positions``, ``draft_token``: per packed row;
- ``padded_row`` [R]: the slot ``b T + j`` of packed row ``qo_indptr[b] + j`` in the padded layout.

Everything after the forward stays in SGLang's padded layout: :meth:`RaggedVerifyInput.scatter`
puts the packed rows' outputs (logits, argmax, hidden states) back at their padded slots, and
SGLang's verify kernels walk ``padded.retrive_*`` as in phase 1. Padding slots receive ``fill``;
no pointer reaches them, so their value is never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_sglang.masks import full_mask
from echo_sglang.padded import PaddedVerifyInput, padded_verify_input


@dataclass(frozen=True, slots=True)
class RaggedVerifyInput:
    """Packed verify rows plus the padded pointer layout they scatter back to."""

    draft_token: Tensor  # [R] int64, packed rows, root first per request
    positions: Tensor  # [R] int64
    qo_indptr: Tensor  # [B+1] int64, request b owns rows qo_indptr[b]:qo_indptr[b+1]
    custom_mask: Tensor  # [sum_b q_b (p_b + q_b)] bool, FULL_MASK blocks
    mask_indptr: Tensor  # [B+1] int64, start of request b's mask block
    padded_row: Tensor  # [R] int64, padded slot b * T + j of every packed row
    padded: PaddedVerifyInput  # pointers and accept width for SGLang's verify kernels

    @property
    def num_rows(self) -> int:
        return int(self.draft_token.numel())

    @property
    def max_q_len(self) -> int:
        """Longest request (rows), for kernels that size their grid by it."""
        return int(self.padded.num_tokens.max()) if self.padded.batch_size else 0

    def scatter(self, rows: Tensor, fill: float | int = 0) -> Tensor:
        """Packed rows [R, ...] -> padded [B * T, ...], padding slots set to ``fill``."""
        if rows.shape[0] != self.num_rows:
            raise ValueError(f"expected {self.num_rows} packed rows, got {rows.shape[0]}")
        b, t = self.padded.batch_size, self.padded.num_draft_tokens
        out = torch.full((b * t, *rows.shape[1:]), fill, dtype=rows.dtype, device=rows.device)
        out[self.padded_row] = rows
        return out

    def gather(self, padded_rows: Tensor) -> Tensor:
        """Padded [B * T, ...] -> packed [R, ...] (e.g. SGLang's out_cache_loc per row)."""
        return padded_rows[self.padded_row]


def ragged_verify_input(
    tree: TreeBatch,
    root_token: Tensor,  # [B] int64
    seq_lens: Tensor,  # [B] int64, cached tokens per request
    num_draft_tokens: int | None = None,  # T of the padded layout results scatter to
    max_tree_depth: int | None = None,
) -> RaggedVerifyInput:
    """Encode ``tree`` for a ragged verify forward (module docstring)."""
    padded = padded_verify_input(tree, root_token, seq_lens, num_draft_tokens, max_tree_depth)
    b, t = padded.batch_size, padded.num_draft_tokens
    q = padded.num_tokens  # [B]
    dev = tree.device
    cu = torch.zeros(b + 1, dtype=torch.int64, device=dev)
    cu[1:] = torch.cumsum(q, 0)
    r = int(cu[-1])
    req = torch.repeat_interleave(torch.arange(b, device=dev), q)
    local = torch.arange(r, device=dev) - cu[:-1][req]
    padded_row = req * t + local
    visible = padded.tree_mask.reshape(b * t, t)[padded_row]  # [R, T], zero beyond q_b
    mask, mask_indptr = full_mask(visible, cu, padded.seq_lens)
    return RaggedVerifyInput(
        draft_token=padded.draft_token[padded_row],
        positions=padded.positions[padded_row],
        qo_indptr=cu,
        custom_mask=mask,
        mask_indptr=mask_indptr,
        padded_row=padded_row,
        padded=padded,
    )
