"""Phase 1, padded: a SuperTree as SGLang's EAGLE verify input, ``T`` rows per request.

Every request gets exactly ``T`` verify rows (its root, its ``n_b`` nodes, then ``T - 1 - n_b``
padding rows), so SGLang's target-verify forward, its CUDA graphs and its verify kernels run
unchanged. Conventions, checked against SGLang 0.5.23's ``build_tree_kernel_efficient`` (the
tests compare with its Triton port on EAGLE pools):

- ``draft_token`` [B * T]: request b's root token at ``b * T``, node i at ``b * T + 1 + i``;
- ``positions`` [B * T]: ``seq_len[b] + depth`` (root depth 0);
- ``retrive_index`` [B, T]: ``b * T + j`` for *every* slot, padding included (SGLang's builder
  never writes -1 there; echo-core's ``to_sglang`` does for padding, replaced here);
- ``retrive_next_token`` / ``retrive_next_sibling`` [B, T]: first child and next sibling (local
  slots, -1 = none), children in node order;
- ``tree_mask`` [B, T, T]: row j sees slot c iff c is j, j's ancestor or the root.

Padding rows hold token 0 at position ``seq_len[b]``, see only themselves (and the cached prefix
in the FULL_MASK encoding) and no pointer reaches them: they can never be accepted. Echo-core's
``to_sglang`` builds the tree part; this module adds SGLang's index convention, the mask
encodings (:mod:`~echo_sglang.masks`) and the accept-index width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.layouts import to_sglang
from echo_core.tree import TreeBatch
from echo_sglang.masks import TreeMaskMode, encode_mask


@dataclass(frozen=True, slots=True)
class PaddedVerifyInput:
    """The tensors SGLang's ``EagleVerifyInput`` carries for one step (module docstring)."""

    draft_token: Tensor  # [B * T] int64
    positions: Tensor  # [B * T] int64
    retrive_index: Tensor  # [B, T] int64
    retrive_next_token: Tensor  # [B, T] int64
    retrive_next_sibling: Tensor  # [B, T] int64
    tree_mask: Tensor  # [B, T, T] bool
    seq_lens: Tensor  # [B] int64, cached tokens per request (the root is not cached)
    num_tokens: Tensor  # [B] int64, real rows per request: n_b + 1
    max_tree_depth: int  # accept_index width: deepest node + 1 (root), >= 1

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.numel())

    @property
    def num_draft_tokens(self) -> int:
        """T, root included (SGLang's ``draft_token_num``)."""
        return int(self.retrive_index.shape[1])

    def custom_mask(self, mode: TreeMaskMode | int = TreeMaskMode.FULL_MASK) -> Tensor:
        """The tree mask in SGLang's encoding ``mode`` (:mod:`~echo_sglang.masks`)."""
        return encode_mask(mode, self.tree_mask, self.seq_lens)


def padded_verify_input(
    tree: TreeBatch,
    root_token: Tensor,  # [B] int64, last committed token per request
    seq_lens: Tensor,  # [B] int64, cached tokens per request
    num_draft_tokens: int | None = None,  # T; default: the largest tree + 1
    max_tree_depth: int | None = None,  # default: the deepest node + 1
) -> PaddedVerifyInput:
    """Encode ``tree`` in SGLang's padded verify layout (module docstring)."""
    layout = to_sglang(tree, root_token, seq_lens, num_draft_tokens)
    b, t = layout.retrive_index.shape
    need = tree.max_depth() + 1
    depth = need if max_tree_depth is None else max_tree_depth
    if depth < need:
        raise ValueError(f"max_tree_depth={max_tree_depth} is below the tree's depth + 1 = {need}")
    index = torch.arange(b * t, dtype=torch.int64, device=tree.device).view(b, t)
    return PaddedVerifyInput(
        draft_token=layout.draft_token,
        positions=layout.positions,
        retrive_index=index,
        retrive_next_token=layout.retrive_next_token,
        retrive_next_sibling=layout.retrive_next_sibling,
        tree_mask=layout.tree_mask,
        seq_lens=seq_lens.to(torch.int64),
        num_tokens=layout.num_tokens,
        max_tree_depth=depth,
    )
