"""A fixed-layout selection as SGLang's padded verify input, with no host sync (issue #44).

:func:`~echo_sglang.padded.padded_verify_input` encodes a packed SuperTree; building that tree
(``select_nodes``) and encoding it read counts on the host. :func:`fixed_verify_input` encodes
the selection straight from the slab layout of :mod:`~echo_sglang.fixed_replay` ([B, S] slots,
each with its EAGLE candidate, its parent's column and its depth), in the same conventions
(``padded``'s module docstring), to the same tensors (tested against it):

- rows: a request's kept slots in slot order, which is the pool's (depth, parent, rank) order,
  at rows ``1 .. n_b`` (``row = cumsum(keep)`` along the request's slots), the root at row 0;
- ``retrive_next_token[p]``: the smallest row whose parent row is p (a scatter-min);
- ``retrive_next_sibling[j]``: ``j + 1`` when row ``j + 1`` is real and has j's parent (siblings
  sit next to each other in that order), else -1;
- ``tree_mask``: real row j sees the root and its ancestors-or-self, built depth by depth
  (``mask[j] = mask[parent(j)] | e_j``); padding rows see only themselves.

:func:`write_tree_blocks` writes the mask into SGLang's buffer without a host read: QLEN_ONLY and
the bit-packed words are fixed-size; FULL_MASK writes each request's [T, T] block at its offset
``sum_{c<b} T (p_c + T) + j (p_b + T) + p_b`` and leaves the prefix columns as SGLang left them
for its own tree of the same T: all True, since SGLang fills a mask that is read with True
before its tree kernel writes the tree cells (``build_tree_kernel_efficient``'s
``fill_prefix_mask``, set to ``verify_mask.is_read``; SGLang 0.5.23), and unread otherwise.
:func:`~echo_sglang.step.overwrite_verify_input` without ``prefix_filled`` rewrites them too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.layouts import NO_INDEX
from echo_sglang.masks import TreeMaskMode, bitpacked_mask, qlen_only_mask, write_mask
from echo_sglang.padded import PaddedVerifyInput


@dataclass(frozen=True, slots=True)
class SlotTree:
    """A selection in the slab layout: [B, S] each (``depth`` [S])."""

    keep: Tensor  # bool, the selected slots (ancestor-closed, <= T - 1 per request)
    token: Tensor  # int64, every slot's token (anything where not kept)
    parent: Tensor  # int64, the parent's column, -1 for a root child
    depth: Tensor  # [S] int64 >= 1


def fixed_verify_input(
    tree: SlotTree,
    root_token: Tensor,  # [B] int64
    seq_lens: Tensor,  # [B] int64, cached tokens per request
    num_draft_tokens: int,  # T, root included
    max_tree_depth: int,  # accept_index width (the caller's: EAGLE's steps + 1)
) -> PaddedVerifyInput:
    """Encode ``tree`` in SGLang's padded verify layout (module docstring)."""
    keep = tree.keep
    b, s = keep.shape
    t, dev = num_draft_tokens, keep.device
    cols = t + 1  # column t: where every unkept slot is dropped
    row = torch.where(keep, torch.cumsum(keep.to(torch.int64), dim=1), t)  # [B, S]
    n = keep.sum(dim=1)  # [B] nodes per request
    prow = torch.where(tree.parent >= 0, row.gather(1, tree.parent.clamp(min=0)), 0)
    depth = tree.depth.expand(b, s)

    def rows(values: Tensor, fill: int) -> Tensor:  # slot values -> [B, T] by row
        out = torch.full((b, cols), fill, dtype=torch.int64, device=dev)
        return out.scatter_(1, row, values.to(torch.int64))[:, :t]

    draft = rows(tree.token, 0)
    draft[:, 0] = root_token.to(torch.int64)
    row_depth = rows(depth, 0)
    parent_row = rows(prow, NO_INDEX)  # root and padding: none
    positions = seq_lens.to(torch.int64).unsqueeze(1) + row_depth
    first = torch.full((b, cols), t, dtype=torch.int64, device=dev)
    first.scatter_reduce_(1, torch.where(keep, prow, t), row, reduce="amin")
    next_token = torch.where(first[:, :t] == t, NO_INDEX, first[:, :t])
    j = torch.arange(t, device=dev)
    real = j.unsqueeze(0) <= n.unsqueeze(1)  # [B, T], root included
    follows = torch.zeros_like(real)
    follows[:, :-1] = real[:, 1:] & (parent_row[:, 1:] == parent_row[:, :-1]) & (j[1:] > 1)
    next_sibling = torch.where(follows, j + 1, NO_INDEX)
    eye = torch.eye(t, dtype=torch.bool, device=dev).expand(b, t, t)
    mask = eye.clone()
    mask[:, :, 0] |= real
    index = parent_row.clamp(min=0).unsqueeze(2).expand(b, t, t)
    for d in range(1, max_tree_depth):  # rows of depth d inherit their parent's row
        inherit = mask.gather(1, index) | eye
        mask = torch.where(((row_depth == d) & real).unsqueeze(2), inherit, mask)
    return PaddedVerifyInput(
        draft_token=draft.reshape(-1),
        positions=positions.reshape(-1),
        retrive_index=torch.arange(b * t, dtype=torch.int64, device=dev).view(b, t),
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        tree_mask=mask,
        seq_lens=seq_lens.to(torch.int64),
        num_tokens=n + 1,
        max_tree_depth=max_tree_depth,
    )


def write_tree_blocks(buffer: Tensor, layout: PaddedVerifyInput, mode: TreeMaskMode | int) -> None:
    """Write ``layout``'s tree mask into SGLang's ``custom_mask`` buffer in ``mode`` with no host
    read (module docstring: FULL_MASK leaves the prefix columns as they are)."""
    mode = TreeMaskMode(int(mode))
    if mode is TreeMaskMode.QLEN_ONLY:
        write_mask(buffer, qlen_only_mask(layout.tree_mask))
        return
    if mode is TreeMaskMode.QLEN_ONLY_BITPACKING:
        write_mask(buffer, bitpacked_mask(layout.tree_mask))
        return
    if buffer.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"custom_mask buffer is {buffer.dtype}; FULL_MASK is bool or uint8")
    mask = layout.tree_mask
    b, t, _ = mask.shape
    p = layout.seq_lens
    width = p + t  # [B] columns per row
    start = torch.cumsum(t * width, 0) - t * width  # [B] first entry of each block
    j = torch.arange(t, device=mask.device)
    at = (start + p).view(b, 1, 1) + j.view(1, t, 1) * width.view(b, 1, 1) + j.view(1, 1, t)
    buffer.view(-1).index_copy_(0, at.reshape(-1), mask.reshape(-1).to(buffer.dtype))
