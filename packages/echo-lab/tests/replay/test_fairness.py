"""Per-request tails of a replayed arm (replay.fairness), on a hand-computed case."""

from __future__ import annotations

import pytest
import torch

from echo_core.tree import make_tree
from echo_lab.replay.fairness import request_tails
from echo_lab.sim.trace import RecordedStep


def _step(names: tuple[str, ...] | None) -> RecordedStep:
    pool = make_tree([[(1, -1, -0.1)], [(2, -1, -0.1)]])
    return RecordedStep(
        pool,
        torch.tensor([[1], [2]]),
        torch.tensor([4, 4]),
        names,
        None if names is None else (1, 1),
    )


def test_tails_follow_the_formula_on_a_hand_computed_case() -> None:
    steps = [_step(("a", "b")), _step(("a", "b")), _step(("a", "c")), _step(("a", "c"))]
    accepted = torch.tensor([[2, 0], [1, 0], [0, 5], [3, 0]])
    verified = torch.tensor([[3, 0], [2, 0], [1, 6], [3, 0]])
    seconds = torch.full((4,), 2.0, dtype=torch.float64)
    plain = torch.ones(4, dtype=torch.float64)
    tails = request_tails(steps, accepted, verified, seconds, plain)
    assert tails is not None
    # a: 10 tokens in 8 s against 4 tokens in 4 s: 1.25; b and c have 2 steps (< 3): left out
    assert tails.requests == 1
    assert tails.speedup_p10 == pytest.approx(1.25)
    assert tails.speedup_min == pytest.approx(1.25)
    # b verified nothing in steps 0 and 1 while a did; c in step 3 (one step)
    assert tails.starved_max == 2


def test_p10_interpolates_and_unnamed_steps_have_no_tails() -> None:
    steps = [_step(("a", "b"))] * 3
    accepted = torch.tensor([[2, 0], [1, 0], [1, 0]])
    verified = torch.tensor([[3, 0], [2, 0], [1, 1]])
    seconds = torch.full((3,), 2.0, dtype=torch.float64)
    plain = torch.ones(3, dtype=torch.float64)
    tails = request_tails(steps, accepted, verified, seconds, plain)
    assert tails is not None
    # a: 7 tokens / 6 s against 1 token/s: 7/6; b: 3 tokens / 6 s: 0.5
    assert tails.speedup_min == pytest.approx(0.5)
    assert tails.speedup_p10 == pytest.approx(0.5 + 0.1 * (7 / 6 - 0.5))
    assert tails.starved_max == 2  # b starved in steps 0 and 1; step 2 it verified a row
    assert request_tails([_step(None)], accepted[:1], verified[:1], seconds[:1], plain[:1]) is None
