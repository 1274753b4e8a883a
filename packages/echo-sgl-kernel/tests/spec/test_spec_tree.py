"""Tree build, greedy verify and NGRAM tree rebuild against SGLang's Triton twins."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from sgl_kernel.library import registered_ops
from sgl_kernel.spec import verify_tree_greedy_cpu
from sgl_kernel.spec_tree import (
    FULL_MASK,
    QLEN_ONLY,
    QLEN_ONLY_BITPACKING,
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask,
)

from .conftest import Twins
from .drafts import ancestor_mask, eagle_draft, random_parents, tree_parents

JUNK = 7_777
"""Written into outputs before a call: an element a kernel leaves alone keeps it."""

Outputs = dict[str, Tensor]


def _build(
    fn: Callable[..., Any],
    parent_list: Tensor,
    selected: Tensor,
    seq_lens: Tensor,
    shape: tuple[int, int, int],  # topk, steps, T
    mode: int,
    mask_seed: int,
    junk_links: bool = False,
) -> Outputs:
    """Run a tree builder on fresh buffers initialised as SGLang's caller does (or with junk)."""
    topk, steps, t = shape
    b = seq_lens.numel()
    size = b * t * t + (int(seq_lens.sum()) * t if mode == FULL_MASK else 0)
    mask = torch.rand((size,), generator=torch.Generator().manual_seed(mask_seed)) < 0.5
    links = torch.full((3, b, t), -1, dtype=torch.int64)
    if junk_links:
        links[1:] = torch.randint(-1, t, (2, b, t), generator=torch.Generator().manual_seed(1))
    out = {"tree_mask": mask, "positions": torch.full((b * t,), JUNK, dtype=torch.int64)}
    out |= {"retrive_index": links[0], "retrive_next_token": links[1]}
    out["retrive_next_sibling"] = links[2]
    fn(parent_list, selected, seq_lens, *out.values(), topk, steps, t, mode)
    return out


def _assert_equal(ours: Outputs, theirs: Outputs) -> None:
    for name, value in theirs.items():
        assert ours[name].tolist() == value.tolist(), name


TREE_SHAPES = [
    # batch, topk, steps, T
    (1, 1, 1, 2),
    (1, 1, 4, 5),
    (2, 1, 3, 3),
    (3, 2, 3, 6),
    (2, 4, 3, 8),
    (4, 3, 4, 10),
    (2, 8, 2, 12),
    (1, 4, 5, 16),
    (2, 2, 3, 1),
]


@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
@pytest.mark.parametrize(("batch", "topk", "steps", "t"), TREE_SHAPES)
def test_build_tree_matches_sglang_triton(
    twins: Twins, batch: int, topk: int, steps: int, t: int, mode: int
) -> None:
    gen = torch.Generator().manual_seed(batch * 1000 + topk * 100 + steps * 10 + t)
    parent_list, selected = eagle_draft(gen, batch, topk, steps, t)
    seq_lens = torch.randint(0, 9, (batch,), generator=gen)
    args = (parent_list, selected, seq_lens, (topk, steps, t), mode, t)
    ours = _build(build_tree_kernel_efficient_cpu, *args)
    _assert_equal(ours, _build(twins.build_tree, *args))
    parents = tree_parents(parent_list, selected, topk)
    if mode == QLEN_ONLY and t > 1:
        assert ours["tree_mask"].tolist() == ancestor_mask(parents).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_build_tree_with_unselected_parents_matches_sglang_triton(twins: Twins, seed: int) -> None:
    """Selections that drop a parent (the kernels skip such nodes) and junk in the link lists
    (the largest child inherits the old first-child entry) follow the Triton kernel."""
    gen = torch.Generator().manual_seed(seed)
    batch, topk, steps, t = 3, 2 + seed % 2, 4, 7
    parent_list, _ = eagle_draft(gen, batch, topk, steps, t)
    entries = topk + (steps - 1) * topk * topk
    selected = torch.stack([torch.randperm(entries, generator=gen)[: t - 1] for _ in range(batch)])
    selected = selected.sort(dim=1).values
    seq_lens = torch.randint(1, 6, (batch,), generator=gen)
    for mode in (QLEN_ONLY, FULL_MASK):
        args = (parent_list, selected, seq_lens, (topk, steps, t), mode, seed)
        ours = _build(build_tree_kernel_efficient_cpu, *args, junk_links=True)
        _assert_equal(ours, _build(twins.build_tree, *args, junk_links=True))


def test_build_tree_worked_example() -> None:
    """topk 2, 2 steps: entries 0, 1 hang under the root, entry 2 under entry 0 (node 1)."""
    parent_list = torch.tensor([[-1, 0, 1]])
    selected = torch.tensor([[0, 1, 2]])
    out = _build(
        build_tree_kernel_efficient_cpu,
        parent_list,
        selected,
        torch.tensor([5]),
        (2, 2, 4),
        QLEN_ONLY,
        0,
    )
    assert out["retrive_next_token"].tolist() == [[1, 3, -1, -1]]
    assert out["retrive_next_sibling"].tolist() == [[-1, 2, -1, -1]]
    assert out["retrive_index"].tolist() == [[0, 1, 2, 3]]
    assert out["positions"].tolist() == [5, 6, 6, 7]
    rows = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert out["tree_mask"].view(4, 4).int().tolist() == rows


def test_build_tree_rejects_bitpacked_and_unknown_masks() -> None:
    parent_list, selected = torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]])
    for mode, error in ((QLEN_ONLY_BITPACKING, NotImplementedError), (3, ValueError)):
        with pytest.raises(error):
            _build(
                build_tree_kernel_efficient_cpu,
                parent_list,
                selected,
                torch.tensor([2]),
                (2, 2, 4),
                mode,
                0,
            )


def _verify(
    fn: Callable[..., Any], tree: Outputs, candidates: Tensor, target: Tensor, width: int
) -> Outputs:
    """Run a greedy verifier on buffers initialised as SGLang's caller does (predicts junk)."""
    b, t = candidates.shape
    out = {
        "predicts": torch.full((b * t,), JUNK, dtype=torch.int32),
        "accept_index": torch.full((b, width), -1, dtype=torch.int32),
        "accept_token_num": torch.full((b,), JUNK, dtype=torch.int32),
    }
    links = (tree["retrive_index"], tree["retrive_next_token"], tree["retrive_next_sibling"])
    fn(*out.values(), candidates, *links, target)
    return out


def _eagle_tree(gen: torch.Generator, batch: int, topk: int, steps: int, t: int) -> Outputs:
    parent_list, selected = eagle_draft(gen, batch, topk, steps, t)
    seq_lens = torch.randint(0, 5, (batch,), generator=gen)
    return _build(
        build_tree_kernel_efficient_cpu,
        parent_list,
        selected,
        seq_lens,
        (topk, steps, t),
        QLEN_ONLY,
        0,
    )


VERIFY_SHAPES = [
    # batch, topk, steps, T, vocab (small vocabularies make siblings share tokens)
    (1, 1, 3, 4, 2),
    (3, 2, 3, 6, 3),
    (2, 4, 4, 10, 2),
    (4, 3, 3, 9, 4),
    (5, 2, 5, 12, 2),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("batch", "topk", "steps", "t", "vocab"), VERIFY_SHAPES)
def test_verify_greedy_matches_sglang_triton(
    twins: Twins, batch: int, topk: int, steps: int, t: int, vocab: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed * 7919 + batch * 31 + t)
    tree = _eagle_tree(gen, batch, topk, steps, t)
    candidates = torch.randint(0, vocab, (batch, t), generator=gen)
    target = torch.randint(0, vocab, (batch, t), generator=gen)
    ours = _verify(verify_tree_greedy_cpu, tree, candidates, target, steps + 1)
    _assert_equal(ours, _verify(twins.verify_greedy, tree, candidates, target, steps + 1))


def test_verify_greedy_accepts_a_whole_chain(twins: Twins) -> None:
    batch, steps = 3, 4
    tree = _eagle_tree(torch.Generator().manual_seed(0), batch, 1, steps, steps + 1)
    candidates = torch.arange(batch * (steps + 1)).view(batch, -1) + 10
    target = torch.roll(candidates, -1, dims=1)  # the target after node i is node i + 1's token
    ours = _verify(verify_tree_greedy_cpu, tree, candidates, target, steps + 1)
    assert ours["accept_token_num"].tolist() == [steps] * batch
    assert ours["accept_index"].tolist() == tree["retrive_index"].tolist()
    assert ours["predicts"].view(batch, -1).tolist() == target.tolist()
    _assert_equal(ours, _verify(twins.verify_greedy, tree, candidates, target, steps + 1))


def test_verify_greedy_rejecting_everything_emits_the_bonus_token(twins: Twins) -> None:
    batch, t = 2, 8
    tree = _eagle_tree(torch.Generator().manual_seed(1), batch, 2, 3, t)
    candidates = torch.zeros((batch, t), dtype=torch.int64)
    target = torch.arange(1, batch * t + 1).view(batch, t)  # never 0: no draft matches
    ours = _verify(verify_tree_greedy_cpu, tree, candidates, target, 4)
    assert ours["accept_token_num"].tolist() == [0, 0]
    assert ours["accept_index"].tolist() == [[0, -1, -1, -1], [t, -1, -1, -1]]
    bonus = [int(ours["predicts"][b * t]) for b in range(batch)]
    assert bonus == [1, t + 1]
    assert (ours["predicts"] == JUNK).sum() == batch * t - batch
    _assert_equal(ours, _verify(twins.verify_greedy, tree, candidates, target, 4))


def test_verify_greedy_takes_the_first_matching_sibling() -> None:
    """Nodes 1, 2, 3 all hang under the root with the same token; node 1 comes first."""
    tree = _build(
        build_tree_kernel_efficient_cpu,
        torch.tensor([[-1, 0, 1, 2]]),
        torch.tensor([[0, 1, 2]]),
        torch.tensor([0]),
        (3, 2, 4),
        QLEN_ONLY,
        0,
    )
    candidates = torch.tensor([[9, 5, 5, 5]])
    target = torch.tensor([[5, 6, 7, 8]])
    ours = _verify(verify_tree_greedy_cpu, tree, candidates, target, 3)
    assert ours["accept_index"].tolist() == [[0, 1, -1]]
    assert ours["predicts"].tolist()[:2] == [5, 6]


@pytest.mark.parametrize(("batch", "t", "seed"), [(1, 1, 0), (1, 5, 1), (3, 8, 2), (4, 13, 3)])
def test_reconstruct_from_mask_matches_sglang_triton(
    twins: Twins, batch: int, t: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    trees = ancestor_mask(random_parents(gen, batch, t))
    noise = torch.rand((batch * t * t,), generator=gen) < 0.3  # not a tree: the formula still holds
    for mask in (trees, noise):
        seq_lens = torch.randint(0, 20, (batch,), generator=gen)
        outs = []
        for fn in (reconstruct_indices_from_tree_mask, twins.reconstruct):
            bufs = torch.full((4, batch * t), JUNK, dtype=torch.int64)
            fn(mask, seq_lens, bufs[0], bufs[1], bufs[2], bufs[3], batch, t)
            outs.append(bufs.tolist())
        assert outs[0] == outs[1]


def test_reconstruct_recovers_the_built_tree() -> None:
    """NGRAM's rebuild from the QLEN_ONLY mask gives back what the EAGLE builder linked."""
    gen = torch.Generator().manual_seed(5)
    batch, t = 3, 10
    parent_list, selected = eagle_draft(gen, batch, 3, 4, t)
    seq_lens = torch.randint(0, 9, (batch,), generator=gen)
    built = _build(
        build_tree_kernel_efficient_cpu, parent_list, selected, seq_lens, (3, 4, t), QLEN_ONLY, 0
    )
    rebuilt = torch.full((4, batch * t), JUNK, dtype=torch.int64)
    positions, index, first, sibling = rebuilt
    reconstruct_indices_from_tree_mask(
        built["tree_mask"], seq_lens, positions, index, first, sibling, batch, t
    )
    names = ("positions", "retrive_index", "retrive_next_token", "retrive_next_sibling")
    for name, got in zip(names, rebuilt, strict=True):
        assert got.tolist() == built[name].reshape(-1).tolist(), name


def test_keywords_of_sglang_call_site_and_registered_op_agree() -> None:
    """SGLang calls verify with keywords (``retrive_*``, the compiled op's schema names); the
    op registered under torch.ops.sgl_kernel runs the same code."""
    tree = _eagle_tree(torch.Generator().manual_seed(2), 2, 2, 3, 6)
    candidates = torch.zeros((2, 6), dtype=torch.int64)
    target = torch.zeros((2, 6), dtype=torch.int64)
    direct = _verify(verify_tree_greedy_cpu, tree, candidates, target, 4)
    by_keyword = _verify(
        lambda p, a, n, c, ri, rnt, rns, tp: verify_tree_greedy_cpu(
            predicts=p,
            accept_index=a,
            accept_token_num=n,
            candidates=c,
            retrive_index=ri,
            retrive_next_token=rnt,
            retrive_next_sibling=rns,
            target_predict=tp,
        ),
        tree,
        candidates,
        target,
        4,
    )
    _assert_equal(by_keyword, direct)
    assert "verify_tree_greedy_cpu" in registered_ops()
    dispatched = _verify(torch.ops.sgl_kernel.verify_tree_greedy_cpu, tree, candidates, target, 4)
    _assert_equal(dispatched, direct)


def test_empty_batch_is_a_no_op() -> None:
    i32, i64 = torch.int32, torch.int64
    links = torch.empty((3, 0, 4), dtype=i64)
    for mode in (QLEN_ONLY, FULL_MASK):
        build_tree_kernel_efficient_cpu(
            torch.empty((0, 3), dtype=i64),
            torch.empty((0, 3), dtype=i64),
            torch.empty((0,), dtype=i64),
            torch.empty((0,), dtype=torch.bool),
            torch.empty((0,), dtype=i64),
            links[0],
            links[1],
            links[2],
            2,
            2,
            4,
            mode,
        )
    verify_tree_greedy_cpu(
        torch.empty((0,), dtype=i32),
        torch.empty((0, 3), dtype=i32),
        torch.empty((0,), dtype=i32),
        torch.empty((0, 4), dtype=i64),
        links[0],
        links[1],
        links[2],
        torch.empty((0, 4), dtype=i64),
    )
    empty = torch.empty((0,), dtype=i64)
    reconstruct_indices_from_tree_mask(empty, empty, empty, empty, empty, empty, 0, 4)
