"""Metadata of tree attention: verify-row visibility bits, prefill layout, validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from echo_core.layouts import unpack_bits
from echo_core.tree import empty_tree, make_tree
from echo_kernels.attention_metadata import prefill_metadata, verify_metadata

TREE = [[(5, -1, -0.1), (6, -1, -0.2), (7, 0, -0.3)], [], [(8, -1, -0.1)]]


def table(batch: int, width: int = 8) -> torch.Tensor:
    return torch.arange(batch * width, dtype=torch.int64).view(batch, width)


def test_verify_bits_are_root_plus_ancestors_in_local_row_order() -> None:
    tree = make_tree(TREE)
    meta = verify_metadata(tree, torch.tensor([3, 0, 1]), table(3))
    assert meta.cu_rows.tolist() == [0, 4, 5, 7]
    assert meta.positions.tolist() == [3, 4, 4, 5, 0, 1, 2]
    assert meta.max_rows == 4
    assert not bool(meta.causal.any())
    visible = unpack_bits(meta.tree_bits, 4).to(torch.int64).tolist()
    assert visible == [
        [1, 0, 0, 0],  # root of request 0
        [1, 1, 0, 0],  # node 0
        [1, 0, 1, 0],  # node 1
        [1, 1, 0, 1],  # node 2, child of node 0
        [1, 0, 0, 0],  # request 1: root only
        [1, 0, 0, 0],  # request 2: root
        [1, 1, 0, 0],  # its node 0
    ]


def test_wide_trees_use_several_words() -> None:
    chain = [(1, i - 1, -0.1) for i in range(40)]  # 41 verify rows: two 32-bit words
    meta = verify_metadata(make_tree([chain]), torch.tensor([0]), table(1))
    assert meta.tree_bits.shape == (41, 2)
    assert unpack_bits(meta.tree_bits, 41).equal(torch.ones(41, 41, dtype=torch.bool).tril())


def test_prefill_rows_are_causal_from_the_cached_length() -> None:
    meta = prefill_metadata(torch.tensor([2, 0, 3]), torch.tensor([5, 1, 0]), table(3))
    assert meta.cu_rows.tolist() == [0, 2, 2, 5]
    assert meta.positions.tolist() == [5, 6, 0, 1, 2]
    assert bool(meta.causal.all())
    assert meta.tree_bits.shape == (5, 0)
    assert meta.max_rows == 3


def test_empty_batches_are_valid() -> None:
    assert verify_metadata(empty_tree(0), torch.zeros(0, dtype=torch.int64), table(0)).num_rows == 0
    decode = verify_metadata(empty_tree(2), torch.tensor([4, 0]), table(2))
    assert decode.num_rows == 2
    assert decode.max_rows == 1


def test_validate_rejects_inconsistent_metadata() -> None:
    meta = verify_metadata(make_tree(TREE), torch.tensor([3, 0, 1]), table(3))
    with pytest.raises(ValueError, match="max_rows=3"):
        dataclasses.replace(meta, max_rows=3).validate()
    with pytest.raises(ValueError, match="cache_len must be in"):
        dataclasses.replace(meta, cache_len=torch.tensor([3, 0, 9])).validate()
    with pytest.raises(ValueError, match="tree_bits holds 0 columns"):
        dataclasses.replace(meta, tree_bits=meta.tree_bits[:, :0]).validate()
    with pytest.raises(ValueError, match=r"positions must be 1-D torch\.int64"):
        dataclasses.replace(meta, positions=meta.positions.to(torch.int32)).validate()
    with pytest.raises(ValueError, match="cu_rows must rise"):
        dataclasses.replace(meta, cu_rows=torch.tensor([0, 4, 3, 7])).validate()
    with pytest.raises(ValueError, match="num_rows must be"):
        prefill_metadata(torch.tensor([1, -1]), torch.tensor([0, 0]), table(2))
