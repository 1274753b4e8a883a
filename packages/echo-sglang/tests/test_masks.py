"""Mask encodings, by hand (no sglang needed)."""

from __future__ import annotations

import pytest
import torch

from echo_core.tree import make_tree
from echo_sglang.masks import TreeMaskMode, bitpacked_mask, full_mask, write_mask
from echo_sglang.padded import padded_verify_input

# Request 0: root + chain a -> b (3 rows, 2 cached tokens); request 1: root only (1 cached).
TREE = make_tree([[(5, -1, -0.1), (6, 0, -0.2)], []])
ROOTS = torch.tensor([1, 2])
SEQ_LENS = torch.tensor([2, 1])


def test_padded_full_mask_adds_prefix_columns_to_every_row() -> None:
    layout = padded_verify_input(TREE, ROOTS, SEQ_LENS, num_draft_tokens=4)
    mask = layout.custom_mask(TreeMaskMode.FULL_MASK)
    assert mask.numel() == 4 * (2 + 4) + 4 * (1 + 4)
    block1 = mask[24:].view(4, 5)
    assert block1[:, 0].all()  # prefix column, padding rows included
    assert torch.equal(block1[:, 1:], torch.eye(4, dtype=torch.bool) | _root_column(4, rows=1))
    assert torch.equal(layout.custom_mask(TreeMaskMode.QLEN_ONLY), layout.tree_mask.flatten())


def _root_column(t: int, rows: int) -> torch.Tensor:
    col = torch.zeros(t, t, dtype=torch.bool)
    col[:rows, 0] = True
    return col


@pytest.mark.parametrize(("t", "dtype"), [(1, torch.uint8), (8, torch.uint8), (9, torch.uint16),
                                          (16, torch.uint16), (17, torch.uint32)])  # fmt: skip
def test_bitpacked_rows_set_bit_j_for_visible_row_j(t: int, dtype: torch.dtype) -> None:
    mask = torch.zeros(1, t, t, dtype=torch.bool)
    mask[0, :, 0] = True
    mask[0, t - 1, t - 1] = True
    packed = bitpacked_mask(mask)
    assert packed.dtype == dtype
    assert packed.to(torch.int64).tolist() == [1] * (t - 1) + [1 | (1 << (t - 1))]


def test_bitpacking_stops_at_32_rows() -> None:
    with pytest.raises(ValueError, match="at most 32 verify rows, got T=33"):
        bitpacked_mask(torch.zeros(1, 33, 33, dtype=torch.bool))


def test_full_mask_rejects_columns_beyond_a_request() -> None:
    visible = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="beyond its request"):
        full_mask(visible, torch.tensor([0, 2]), torch.tensor([0]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_bool_mask_is_written_as_zero_one_in_the_buffer_dtype(dtype: torch.dtype) -> None:
    buffer = torch.zeros(5, dtype=dtype)
    buffer[3:] = 1  # stale entries past the mask stay
    write_mask(buffer, torch.tensor([True, False, True]))
    assert buffer.dtype == dtype
    assert buffer.to(torch.int64).tolist() == [1, 0, 1, 1, 1]


B, U8, U16 = torch.bool, torch.uint8, torch.uint16


@pytest.mark.parametrize(
    ("mask", "buffer", "message"),
    [
        (torch.ones(3, dtype=B), torch.ones(3, dtype=torch.int32),
         "torch.int32; a torch.bool mask is written as torch.bool or torch.uint8"),
        (torch.ones(3, dtype=B), torch.ones(3), "torch.float32"),
        (torch.ones(3, dtype=U16), torch.ones(3, dtype=U8), "written as torch.uint16$"),
        (torch.ones(3, dtype=U8), torch.ones(3, dtype=B), "written as torch.uint8$"),
        (torch.ones(3, dtype=B), torch.ones(2, dtype=U8), "holds 2 entries, the mask needs 3"),
    ],
)  # fmt: skip
def test_write_mask_refuses_other_dtypes_and_short_buffers(
    mask: torch.Tensor, buffer: torch.Tensor, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_mask(buffer, mask)
