"""One ECHO step as the worker runs it: EAGLE's pool in, SGLang's verify tensors overwritten."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from echo_core.acceptance import greedy_accept
from echo_sglang.args import EchoArgs
from echo_sglang.config import EagleShape, resolve
from echo_sglang.eagle_pool import concat_draft_lists, pool_from_eagle
from echo_sglang.masks import TreeMaskMode
from echo_sglang.pool_capture import capture_draft_pool, organize_hook
from echo_sglang.step import EchoStep, overwrite_verify_input
from echo_sglang.synthetic import eagle2_selection, eagle_draft, following_targets, padded_targets

from .conftest import SGLang

STEPS, TOPK, N, B = 3, 3, 8, 4


def _eagle_verify_input(
    sgl: SGLang, lists: tuple[list[Tensor], list[Tensor], list[Tensor]], root: Tensor,
    seq_lens: Tensor, mode: TreeMaskMode, mask_dtype: torch.dtype = torch.bool,
) -> SimpleNamespace:  # fmt: skip
    """What SGLang's EAGLE builds for this draft (organize + build_tree), as attributes.

    ``mask_dtype``: SGLang's Triton backend preallocates its verify mask as uint8 (``VerifyMask``
    in ``layers/attention/verify_mask.py``), other backends as bool.
    """
    scores, tokens, parents = concat_draft_lists(*lists)
    selected = eagle2_selection(scores, N)
    size = int(seq_lens.sum()) * N + N * N * B if mode is TreeMaskMode.FULL_MASK else N * N * B
    mask = torch.full((size + 13,), True, dtype=mask_dtype)  # a preallocated, larger buffer
    positions = torch.empty(B * N, dtype=torch.int64)
    index, next_token, next_sibling = torch.full((3, B, N), -1, dtype=torch.int64)
    sgl.build_tree(
        parents, selected, seq_lens, mask, positions, index, next_token, next_sibling,
        TOPK, STEPS, N, sgl.tree_mask_mode(int(mode)),
    )  # fmt: skip
    draft = torch.cat([root.unsqueeze(1), tokens.gather(1, selected)], dim=1).flatten()
    return SimpleNamespace(
        draft_token=draft, positions=positions, retrieve_index=index.clone(),
        retrieve_next_token=next_token.clone(), retrieve_next_sibling=next_sibling.clone(),
        custom_mask=mask,
    )  # fmt: skip


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
@pytest.mark.parametrize("mode", [TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY])
def test_echo_step_rewrites_eagle_verify_input_in_place(
    sgl: SGLang, mode: TreeMaskMode, mask_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(int(mode))
    lists = eagle_draft(gen, B, STEPS, TOPK, vocab=32)
    root, seq_lens = torch.arange(B) + 40, torch.tensor([3, 9, 0, 5])
    verify_input = _eagle_verify_input(sgl, lists, root, seq_lens, mode, mask_dtype)
    storage = {name: getattr(verify_input, name).data_ptr() for name in vars(verify_input)}

    config = resolve(EchoArgs(budget=12), EagleShape(STEPS, TOPK, N))
    with capture_draft_pool() as captured:  # what the worker does around EAGLE's draft
        organize_hook(lambda *a: None, *lists, N)
    assert captured.lists is not None
    selection, layout = EchoStep(config).plan(*captured.lists, root, seq_lens)
    overwrite_verify_input(verify_input, layout, mode)

    assert {n: getattr(verify_input, n).data_ptr() for n in vars(verify_input)} == storage
    assert selection.tree.num_nodes == 12
    assert layout.max_tree_depth == STEPS + 1
    assert torch.equal(verify_input.draft_token, layout.draft_token)
    assert torch.equal(verify_input.retrieve_next_token, layout.retrive_next_token)
    mask = layout.custom_mask(mode)
    assert verify_input.custom_mask.dtype == mask_dtype
    assert torch.equal(verify_input.custom_mask[: mask.numel()], mask.to(mask_dtype))  # 0/1

    # SGLang's verify kernel over the overwritten tensors accepts echo-core's reference path.
    tree = selection.tree
    target = following_targets(tree, gen, vocab=32)
    padded_target = padded_targets(tree, target, N)
    ours = sgl.greedy(layout, padded_target)
    ref = greedy_accept(tree, target)
    assert ours.emitted_tokens(tree) == ref.emitted_tokens(tree)
    assert int(ref.num_accepted.sum()) > 0


def test_eagle2_step_verifies_like_sglang_eagle(sgl: SGLang) -> None:
    """With the eagle2 policy and EAGLE's token count, ECHO's tree is SGLang's tree (reordered):
    SGLang's verify kernel accepts the same candidates on both."""
    gen = torch.Generator().manual_seed(7)
    lists = eagle_draft(gen, B, STEPS, TOPK, vocab=8)
    root, seq_lens = torch.arange(B), torch.tensor([2, 2, 2, 2])
    theirs = _eagle_verify_input(sgl, lists, root, seq_lens, TreeMaskMode.QLEN_ONLY)
    config = resolve(EchoArgs(policy="eagle2"), EagleShape(STEPS, TOPK, N))
    selection, ours = EchoStep(config).plan(*lists, root, seq_lens)

    pool = pool_from_eagle(*concat_draft_lists(*lists), TOPK)
    ours_cand = pool.flat_index[selection.pool_index].view(B, N - 1)  # candidate per our slot
    theirs_cand = eagle2_selection(concat_draft_lists(*lists)[0], N)  # per SGLang slot
    # sigma[b, j]: our slot holding SGLang slot j's candidate (root: 0).
    same = ours_cand.unsqueeze(1) == theirs_cand.unsqueeze(2)  # [B, their, ours]
    sigma = torch.cat([torch.zeros(B, 1, dtype=torch.int64), 1 + same.int().argmax(2)], dim=1)

    # Target by SGLang slot, following the first child 80% of the time (deep acceptance).
    draft = theirs.draft_token.view(B, N)
    child = theirs.retrieve_next_token
    follow = torch.rand(B, N, generator=gen) < 0.8
    target = torch.where(follow & (child >= 0), draft.gather(1, child.clamp(min=0)), 7)
    predicts = torch.zeros(B * N, dtype=torch.int32)
    accept = torch.full((B, STEPS + 1), -1, dtype=torch.int32)
    count = torch.zeros(B, dtype=torch.int32)
    sgl.verify_tree_greedy(
        predicts, accept, count, draft, theirs.retrieve_index, child,
        theirs.retrieve_next_sibling, target,
    )  # fmt: skip
    mine = sgl.greedy(ours, torch.empty_like(target).scatter_(1, sigma, target).flatten())

    assert mine.num_accepted.tolist() == count.tolist()
    assert int(count.sum()) > 0
    for b in range(B):
        k = int(count[b])
        their_slots = (accept[b, 1 : k + 1] - b * N - 1).long()
        assert (
            ours_cand[b, mine.accepted_nodes[b, :k]].tolist()
            == theirs_cand[b, their_slots].tolist()
        )
        assert int(mine.bonus_token[b]) == int(predicts[int(accept[b, k])])
