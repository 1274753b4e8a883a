"""SGLang's greedy tree verify over our layouts accepts what echo-core's reference accepts."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult, greedy_accept
from echo_core.tree import TreeBatch, make_tree
from echo_core.verify_rows import verify_offsets
from echo_sglang.padded import PaddedVerifyInput, padded_verify_input
from echo_sglang.synthetic import distinct_sibling_tree, following_targets

from .conftest import SGLang

JUNK = 7_777
"""Written into padding slots of the target output: a kernel that read one would return it."""


def _padded_target(tree: TreeBatch, target: Tensor, t: int) -> Tensor:
    """Verify-row targets [B + N] at their padded slots b * T + j, JUNK elsewhere: [B * T]."""
    out = torch.full((tree.batch_size * t,), JUNK, dtype=torch.int64)
    cu = verify_offsets(tree)
    for b in range(tree.batch_size):
        lo, hi = int(cu[b]), int(cu[b + 1])
        out[b * t : b * t + hi - lo] = target[lo:hi]
    return out


def _assert_same(ours: AcceptResult, ref: AcceptResult) -> None:
    assert ours.num_accepted.tolist() == ref.num_accepted.tolist()
    assert ours.bonus_token.tolist() == ref.bonus_token.tolist()
    width = ref.accepted_nodes.shape[1]
    assert ours.accepted_nodes[:, :width].tolist() == ref.accepted_nodes.tolist()


def _roots(b: int) -> Tensor:
    return torch.arange(100, 100 + b)


@pytest.mark.parametrize("seed", range(6))
def test_padded_layout_accepts_the_reference_path(sgl: SGLang, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    b = 1 + seed % 4
    tree = distinct_sibling_tree(gen, b, max_nodes=9)
    target = following_targets(tree, gen)
    ref = greedy_accept(tree, target)
    t = 10 + seed % 3  # fixed T with padding, as under CUDA graphs
    seq_lens = torch.randint(0, 20, (b,), generator=gen)
    layout = padded_verify_input(tree, _roots(b), seq_lens, num_draft_tokens=t, max_tree_depth=10)
    ours = sgl.greedy(layout, _padded_target(tree, target, t))
    _assert_same(ours, ref)
    assert int(ref.num_accepted.sum()) > 0 or tree.num_nodes == 0


def test_requests_without_nodes_emit_the_root_argmax(sgl: SGLang) -> None:
    tree = make_tree([[], [(3, -1, -0.1)], []])
    target = torch.tensor([5, 3, 9, 6])  # rows: root0, root1, node(3), root2
    layout = padded_verify_input(tree, _roots(3), torch.tensor([2, 2, 2]), num_draft_tokens=3)
    ours = sgl.greedy(layout, _padded_target(tree, target, 3))
    assert ours.num_accepted.tolist() == [0, 1, 0]
    assert ours.bonus_token.tolist() == [5, 9, 6]
    _assert_same(ours, greedy_accept(tree, target))


def test_duplicate_sibling_tokens_take_the_first_sibling_in_sglang(sgl: SGLang) -> None:
    """Known divergence (not reachable with top-k drafts): SGLang commits to the first matching
    sibling, echo-core's reference to the deepest fully matching path."""
    # Root children 0 and 1 both carry token 4; only node 1 has a matching child (node 2).
    tree = make_tree([[(4, -1, -0.1), (4, -1, -0.2), (8, 1, -0.3)]])
    target = torch.tensor([4, 0, 8, 2])  # rows: root, node0, node1, node2
    layout = padded_verify_input(tree, _roots(1), torch.tensor([3]))
    ours = sgl.greedy(layout, _padded_target(tree, target, layout.num_draft_tokens))
    ref = greedy_accept(tree, target)
    assert ours.accepted_nodes[0, : int(ours.num_accepted[0])].tolist() == [0]
    assert ref.accepted_nodes[0].tolist() == [1, 2]
    assert ours.emitted_tokens(tree) == [[4, 0]]
    assert ref.emitted_tokens(tree) == [[4, 8, 2]]


def test_accept_width_must_cover_the_deepest_node() -> None:
    tree = make_tree([[(1, -1, -0.1), (2, 0, -0.1), (3, 1, -0.1)]])
    with pytest.raises(ValueError, match="max_tree_depth=3 is below"):
        padded_verify_input(tree, _roots(1), torch.tensor([0]), max_tree_depth=3)


def test_padding_rows_are_isolated_and_unreachable() -> None:
    tree = make_tree([[(1, -1, -0.1)], [(2, -1, -0.1), (3, 0, -0.2)]])
    layout: PaddedVerifyInput = padded_verify_input(
        tree, _roots(2), torch.tensor([4, 6]), num_draft_tokens=5
    )
    mask = layout.tree_mask
    assert torch.equal(mask[0, 2:], torch.eye(5, dtype=torch.bool)[2:])  # request 0 pads 2..4
    assert layout.retrive_index.tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    reachable = set(layout.retrive_next_token[0].tolist()) | set(
        layout.retrive_next_sibling[0].tolist()
    )
    assert reachable <= {-1, 1}
    assert layout.positions.tolist() == [4, 5, 4, 4, 4, 6, 7, 8, 6, 6]
