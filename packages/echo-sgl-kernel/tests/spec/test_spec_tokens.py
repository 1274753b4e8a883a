"""Bonus-token gather and draft input rotation against SGLang's Triton twins."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from sgl_kernel.spec_tokens import fill_bonus_tokens_cpu, rotate_input_ids_cpu

from .conftest import Twins

JUNK = 7_777
"""Written into outputs before a call: an element a kernel leaves alone keeps it."""


@pytest.mark.parametrize(("batch", "width"), [(1, 1), (1, 4), (5, 3), (9, 6)])
def test_bonus_tokens_match_sglang_triton(twins: Twins, batch: int, width: int) -> None:
    gen = torch.Generator().manual_seed(batch * 10 + width)
    tokens = torch.randint(0, 1000, (batch, width), generator=gen, dtype=torch.int32)
    lens = torch.randint(1, width + 1, (batch,), generator=gen, dtype=torch.int32)
    outs = torch.full((2, batch), JUNK, dtype=torch.int32)
    fill_bonus_tokens_cpu(tokens, lens, outs[0], width)
    twins.fill_bonus_tokens(tokens, lens, outs[1], width, batch)
    assert outs[0].tolist() == outs[1].tolist()
    assert outs[0].tolist() == [tokens[b, int(lens[b]) - 1] for b in range(batch)]


def test_bonus_tokens_reject_empty_accepts() -> None:
    tokens = torch.zeros((2, 3), dtype=torch.int32)
    with pytest.raises(ValueError, match="accept_lens"):
        fill_bonus_tokens_cpu(tokens, torch.tensor([1, 0]), torch.empty(2, dtype=torch.int32), 3)


def _segments(gen: torch.Generator, batch: int, longest: int) -> tuple[Tensor, Tensor]:
    """Packed extend segments with gaps between them: (start_loc, seq_lens), int64."""
    lens = torch.randint(0, longest + 1, (batch,), generator=gen)
    lens[0] = 1  # a one-token segment only gets its new token
    gaps = torch.randint(0, 3, (batch,), generator=gen)
    starts = torch.cumsum(lens + gaps, 0) - lens
    return starts, lens


@pytest.mark.parametrize("select", [False, True])
@pytest.mark.parametrize(("batch", "longest"), [(1, 1), (3, 5), (6, 20)])
def test_rotate_input_ids_matches_sglang_triton(
    twins: Twins, batch: int, longest: int, select: bool
) -> None:
    gen = torch.Generator().manual_seed(batch * 100 + longest + select)
    starts, lens = _segments(gen, batch, longest)
    total = int((starts + lens).max()) + 2
    ids = torch.randint(0, 1000, (total,), generator=gen).expand(2, -1).clone()
    new = torch.randint(5000, 6000, (batch, 1), generator=gen)
    pick = None
    if select:
        inside = (torch.rand((batch,), generator=gen) * lens).long()
        pick = starts + inside.clamp(max=(lens - 1).clamp(min=0))
    rotate_input_ids_cpu(ids[0], starts, lens, new, pick)
    twins.rotate_input_ids(ids[1], starts, lens, new, pick)
    assert ids[0].tolist() == ids[1].tolist()


def test_rotate_input_ids_shifts_and_appends() -> None:
    ids = torch.tensor([10, 11, 12, 20, 99, 30, 31])
    rotate_input_ids_cpu(
        ids, torch.tensor([0, 3, 4, 5]), torch.tensor([3, 1, 0, 2]), torch.tensor([1, 2, 3, 4])
    )
    assert ids.tolist() == [11, 12, 1, 2, 99, 31, 4]
