"""Tier 2: greedy and stochastic acceptance kernels give echo-core's results exactly."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult
from echo_core.acceptance_stochastic import AcceptUniforms, draw_uniforms
from echo_core.errors import AcceptanceError
from echo_core.random_trees import random_tree_batch
from echo_core.tree import TreeBatch, empty_tree, make_tree
from echo_core.verify_rows import node_rows, parent_rows, root_rows
from echo_kernels.acceptance import greedy_accept, stochastic_accept


def assert_same(got: AcceptResult, want: AcceptResult) -> None:
    assert torch.equal(got.accepted_nodes.cpu(), want.accepted_nodes.cpu()), (got, want)
    assert torch.equal(got.num_accepted.cpu(), want.num_accepted.cpu()), (got, want)
    assert torch.equal(got.bonus_token.cpu(), want.bonus_token.cpu()), (got, want)


def greedy_both(tree: TreeBatch, argmax: Tensor, device: torch.device) -> AcceptResult:
    got = greedy_accept(tree.to(device), argmax.to(device), backend="triton")
    want = greedy_accept(tree, argmax, backend="torch")
    assert_same(got, want)
    return want


def test_greedy_matches_reference_on_random_trees(kernel_device: torch.device) -> None:
    g = torch.Generator().manual_seed(0)
    total = 0
    for _ in range(12):
        tree = random_tree_batch(g, batch_size=6, max_nodes=11, vocab=3)
        argmax = torch.randint(0, 3, (tree.batch_size + tree.num_nodes,), generator=g)
        total += int(greedy_both(tree, argmax, kernel_device).num_accepted.sum())
    assert total > 10  # the small vocab makes matches common: deep paths are exercised


def test_greedy_tree_wider_than_one_node_block(kernel_device: torch.device) -> None:
    g = torch.Generator().manual_seed(1)
    tree = random_tree_batch(g, batch_size=2, max_nodes=150, vocab=2, allow_empty=False)
    argmax = torch.randint(0, 2, (tree.batch_size + tree.num_nodes,), generator=g)
    greedy_both(tree, argmax, kernel_device)


def test_greedy_all_accepted_emits_bonus_after_deepest_node(kernel_device: torch.device) -> None:
    tree = make_tree([[(4, -1, -0.1), (5, 0, -0.1), (6, 1, -0.1)], [(7, -1, -0.1)]])
    argmax = torch.zeros(tree.batch_size + tree.num_nodes, dtype=torch.int64)
    argmax[parent_rows(tree)] = tree.token  # every node is what the target predicts
    argmax[node_rows(tree)[[2, 3]]] = torch.tensor([8, 9])  # bonus tokens at the leaves
    result = greedy_both(tree, argmax, kernel_device)
    assert result.emitted_tokens(tree) == [[4, 5, 6, 8], [7, 9]]


def test_greedy_all_rejected_emits_root_argmax(kernel_device: torch.device) -> None:
    g = torch.Generator().manual_seed(2)
    tree = random_tree_batch(g, batch_size=5, max_nodes=7, vocab=4)
    argmax = torch.full((tree.batch_size + tree.num_nodes,), 99, dtype=torch.int64)
    result = greedy_both(tree, argmax, kernel_device)
    assert result.num_accepted.tolist() == [0] * 5
    assert result.bonus_token.tolist() == [99] * 5


@pytest.mark.parametrize("batch", [0, 3])
def test_greedy_empty_trees(kernel_device: torch.device, batch: int) -> None:
    tree = empty_tree(batch)
    greedy_both(tree, torch.arange(batch, dtype=torch.int64) + 5, kernel_device)


def random_problem(
    g: torch.Generator, tree: TreeBatch, vocab: int, sparse: bool, kinds: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(target [B+N, V], sampled [N], draft [B+N, V]) with one candidate kind per parent row."""
    r = tree.batch_size + tree.num_nodes
    logits = torch.randn(r, vocab, generator=g) * 2
    logits[:, 4:] -= 2.5  # drafted tokens (< 4) carry most of the mass: many acceptances
    target = torch.softmax(logits, dim=-1)
    if sparse:  # top-p-like zeros, and rows where drafted tokens have no mass at all
        target = torch.where(target < 0.03, 0.0, target)
        target = target / target.sum(dim=-1, keepdim=True)
    draft = torch.softmax(torch.randn(r, vocab, generator=g), dim=-1)
    per_row = {
        "sampled": torch.ones(r, dtype=torch.bool),
        "deterministic": torch.zeros(r, dtype=torch.bool),
        "mixed": torch.rand(r, generator=g) < 0.5,
    }[kinds]
    return target, per_row[parent_rows(tree)], draft


def stochastic_both(
    tree: TreeBatch, target: Tensor, sampled: Tensor, draft: Tensor | None,
    u: AcceptUniforms, device: torch.device,
) -> AcceptResult:  # fmt: skip
    dev_u = AcceptUniforms(u.node.to(device), u.bonus.to(device))
    dev_draft = None if draft is None else draft.to(device)
    got = stochastic_accept(
        tree.to(device), target.to(device), sampled.to(device), dev_draft, dev_u,
        backend="triton",
    )  # fmt: skip
    want = stochastic_accept(tree, target, sampled, draft, u, backend="torch")
    assert_same(got, want)
    return want


@pytest.mark.parametrize("kinds", ["sampled", "deterministic", "mixed"])
def test_stochastic_matches_reference_for_the_same_uniforms(
    kernel_device: torch.device, kinds: str
) -> None:
    g = torch.Generator().manual_seed(3)
    accepted = 0
    for trial in range(6):
        tree = random_tree_batch(g, batch_size=5, max_nodes=9, vocab=4)
        target, sampled, draft = random_problem(g, tree, 37, trial % 2 == 1, kinds)
        u = draw_uniforms(tree, g)
        result = stochastic_both(tree, target, sampled, draft, u, kernel_device)
        accepted += int(result.num_accepted.sum())
    assert accepted > 5


def test_stochastic_without_draft_probs(kernel_device: torch.device) -> None:
    g = torch.Generator().manual_seed(4)
    tree = random_tree_batch(g, batch_size=4, max_nodes=8, vocab=4)
    target, _, _ = random_problem(g, tree, 1100, False, "deterministic")  # > one vocab block
    sampled = torch.zeros(tree.num_nodes, dtype=torch.bool)
    stochastic_both(tree, target, sampled, None, draw_uniforms(tree, g), kernel_device)


def test_stochastic_all_accepted_when_target_is_the_drafted_token(
    kernel_device: torch.device,
) -> None:
    tree = make_tree([[(2, -1, -0.1), (3, 0, -0.1)], [(1, -1, -0.1)]])
    target = torch.full((5, 6), 0.0)
    target[parent_rows(tree), tree.token] = 1.0
    target[node_rows(tree)[[1, 2]], 5] = 1.0  # leaves: the bonus is certainly 5
    sampled = torch.zeros(3, dtype=torch.bool)
    u = AcceptUniforms(node=torch.full((3,), 0.999), bonus=torch.tensor([0.5, 0.0]))
    result = stochastic_both(tree, target, sampled, None, u, kernel_device)
    assert result.emitted_tokens(tree) == [[2, 3, 5], [1, 5]]


def test_stochastic_all_rejected_samples_bonus_from_residual(kernel_device: torch.device) -> None:
    g = torch.Generator().manual_seed(5)
    tree = random_tree_batch(g, batch_size=4, max_nodes=6, vocab=3, allow_empty=False)
    target = torch.softmax(torch.randn(tree.batch_size + tree.num_nodes, 9, generator=g), -1)
    target[:, :3] = 0.0  # no mass on any drafted token
    target = target / target.sum(dim=-1, keepdim=True)
    draft = torch.full_like(target, 1 / 9)
    sampled = torch.ones(tree.num_nodes, dtype=torch.bool)
    result = stochastic_both(tree, target, sampled, draft, draw_uniforms(tree, g), kernel_device)
    assert result.num_accepted.tolist() == [0] * 4
    assert bool((result.bonus_token >= 3).all())
    assert bool((target[root_rows(tree), result.bonus_token] > 0).all())


@pytest.mark.parametrize("batch", [0, 2])
def test_stochastic_empty_trees(kernel_device: torch.device, batch: int) -> None:
    g = torch.Generator().manual_seed(6)
    tree = empty_tree(batch)
    target = torch.softmax(torch.randn(batch, 11, generator=g), dim=-1)
    sampled = torch.zeros(0, dtype=torch.bool)
    stochastic_both(tree, target, sampled, None, draw_uniforms(tree, g), kernel_device)


def test_stochastic_launcher_rejects_bad_tokens_and_uniforms(kernel_device: torch.device) -> None:
    tree = make_tree([[(7, -1, -0.1)]]).to(kernel_device)
    target = torch.full((2, 5), 0.2, device=kernel_device)
    sampled = torch.zeros(1, dtype=torch.bool, device=kernel_device)
    with pytest.raises(AcceptanceError, match="token ids must be < vocab"):
        stochastic_accept(tree, target, sampled, None, draw_uniforms(tree), backend="triton")
    bad = AcceptUniforms(
        node=torch.ones(1, device=kernel_device), bonus=torch.zeros(1, device=kernel_device)
    )
    with pytest.raises(AcceptanceError, match=r"uniforms\.node must lie in \[0, 1\)"):
        stochastic_accept(tree, target, sampled, None, bad, backend="triton")
