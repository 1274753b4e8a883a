"""EAGLE's draft pool as a candidate pool; our layout of EAGLE-2's choice vs SGLang's builder."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from echo_core.tree import ROOT, select_nodes
from echo_sglang.args import PluginConfigError
from echo_sglang.eagle_pool import EaglePool, concat_draft_lists, pool_from_eagle
from echo_sglang.masks import TreeMaskMode
from echo_sglang.padded import PaddedVerifyInput, padded_verify_input
from echo_sglang.synthetic import eagle2_selection, eagle_draft

from .conftest import SGLang


def _pool(seed: int, batch: int, steps: int, topk: int) -> tuple[EaglePool, Tensor, Tensor, Tensor]:
    lists = eagle_draft(torch.Generator().manual_seed(seed), batch, steps, topk)
    scores, tokens, parents = concat_draft_lists(*lists)
    return pool_from_eagle(scores, tokens, parents, topk), scores, tokens, parents


@pytest.mark.parametrize(("steps", "topk"), [(1, 3), (2, 2), (3, 4), (4, 3)])
def test_pool_holds_every_candidate_in_policy_order(steps: int, topk: int) -> None:
    pool, scores, tokens, parents = _pool(steps * 10 + topk, 3, steps, topk)
    tree = pool.tree
    tree.validate()
    m = scores.shape[1]
    assert m == topk + (steps - 1) * topk * topk
    assert tree.nodes_per_request().tolist() == [m] * 3
    req = tree.request_index()
    assert torch.equal(tree.token, tokens[req, pool.flat_index])
    assert torch.allclose(tree.path_logprob.exp(), scores[req, pool.flat_index], rtol=1e-5)
    # SGLang's parent rule: candidate s hangs under the root if s // k == 0, else parents[s // k].
    gp = tree.global_parent()
    for i in range(tree.num_nodes):
        s, b = int(pool.flat_index[i]), int(req[i])
        expected = ROOT if s // topk == 0 else int(parents[b, s // topk])
        assert (ROOT if int(gp[i]) < 0 else int(pool.flat_index[gp[i]])) == expected
    # Order: by depth, then parent position, then rank.
    key = (tree.depth * 10_000 + (tree.parent + 1) * 100 + pool.rank) + req * 10**9
    assert torch.equal(torch.argsort(key), torch.arange(tree.num_nodes))
    assert torch.equal(pool.rank, pool.flat_index % topk)


def test_pool_rejects_shapes_that_are_not_an_eagle_draft() -> None:
    _, scores, tokens, parents = _pool(0, 2, 3, 2)
    with pytest.raises(PluginConfigError, match="is not k \\+ \\(S - 1\\) k\\^2"):
        pool_from_eagle(scores[:, :-1], tokens[:, :-1], parents, 2)
    with pytest.raises(PluginConfigError, match="parents must be"):
        pool_from_eagle(scores, tokens, parents[:, :-1], 2)


def _selected_layout(
    pool: EaglePool, selected: Tensor, root: Tensor, seq_lens: Tensor, n: int
) -> tuple[PaddedVerifyInput, Tensor]:
    """Our layout of the candidates ``selected`` [B, N-1], and sigma [B, N]: SGLang slot -> ours."""
    b, m = selected.shape[0], pool.tree.num_nodes // selected.shape[0]
    keep = torch.zeros(b, m, dtype=torch.bool)
    for r in range(b):
        keep[r] = torch.isin(pool.flat_index.view(b, m)[r], selected[r])
    chosen = keep.flatten()
    tree = select_nodes(pool.tree, chosen)
    layout = padded_verify_input(tree, root, seq_lens, num_draft_tokens=n)
    candidate = pool.flat_index[chosen].view(b, n - 1)  # ours: slot k + 1 holds candidate[:, k]
    sigma = torch.zeros(b, n, dtype=torch.int64)
    for r in range(b):
        where = {int(c): k + 1 for k, c in enumerate(candidate[r].tolist())}
        sigma[r, 1:] = torch.tensor([where[int(c)] for c in selected[r].tolist()])
    return layout, sigma


def _sglang_tree(
    sgl: SGLang, parents: Tensor, selected: Tensor, seq_lens: Tensor, topk: int, steps: int,
    n: int, mode: TreeMaskMode,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    b = selected.shape[0]
    if mode is TreeMaskMode.FULL_MASK:
        mask = torch.full((int(seq_lens.sum()) * n + n * n * b,), True, dtype=torch.bool)
    else:
        mask = torch.full((n * n * b,), True, dtype=torch.bool)
    positions = torch.empty(b * n, dtype=torch.int64)
    index, next_token, next_sibling = torch.full((3, b, n), -1, dtype=torch.int64)
    sgl.build_tree(
        parents, selected, seq_lens, mask, positions, index, next_token, next_sibling,
        topk, steps, n, sgl.tree_mask_mode(int(mode)),
    )  # fmt: skip
    return mask, positions, index, next_token, next_sibling


def _permute_pointer(sigma: Tensor, ptr: Tensor) -> Tensor:
    return torch.where(ptr >= 0, sigma.gather(1, ptr.clamp(min=0)), ptr)


@pytest.mark.parametrize(("steps", "topk", "n"), [(2, 2, 4), (3, 3, 8), (4, 2, 7)])
def test_layout_of_eagle2_choice_matches_sglang_build_tree(
    sgl: SGLang, steps: int, topk: int, n: int
) -> None:
    pool, scores, tokens, parents = _pool(n, 3, steps, topk)
    selected = eagle2_selection(scores, n)
    root = torch.tensor([11, 12, 13])
    seq_lens = torch.tensor([5, 0, 9])
    layout, sigma = _selected_layout(pool, selected, root, seq_lens, n)
    b = 3
    draft = torch.cat([root.unsqueeze(1), tokens.gather(1, selected)], dim=1)  # SGLang's
    ours_draft = layout.draft_token.view(b, n)
    assert torch.equal(ours_draft.gather(1, sigma), draft)
    for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
        mask, positions, index, next_token, next_sibling = _sglang_tree(
            sgl, parents, selected, seq_lens, topk, steps, n, mode
        )
        assert torch.equal(layout.positions.view(b, n).gather(1, sigma), positions.view(b, n))
        assert torch.equal(layout.retrive_index, index)
        assert torch.equal(
            layout.retrive_next_token.gather(1, sigma), _permute_pointer(sigma, next_token)
        )
        assert torch.equal(
            layout.retrive_next_sibling.gather(1, sigma), _permute_pointer(sigma, next_sibling)
        )
        ours_mask = layout.custom_mask(mode)
        assert ours_mask.shape == mask.shape
        if mode is TreeMaskMode.QLEN_ONLY:
            ours_tree, theirs_tree = ours_mask.view(b, n, n), mask.view(b, n, n)
        else:
            ours_tree, theirs_tree = (
                _tree_part(ours_mask, seq_lens, n),
                _tree_part(mask, seq_lens, n),
            )
            assert bool(mask.all() == ours_mask.all())  # prefix columns and all
        for r in range(b):
            s = sigma[r]
            assert torch.equal(ours_tree[r][s][:, s], theirs_tree[r])


def _tree_part(flat: Tensor, seq_lens: Tensor, n: int) -> Tensor:
    """[B, N, N] tree columns of a FULL_MASK; asserts every prefix column is set."""
    blocks, start = [], 0
    for p in seq_lens.tolist():
        block = flat[start : start + n * (p + n)].view(n, p + n)
        assert bool(block[:, :p].all())
        blocks.append(block[:, p:])
        start += n * (p + n)
    assert start == flat.numel()
    return torch.stack(blocks)
