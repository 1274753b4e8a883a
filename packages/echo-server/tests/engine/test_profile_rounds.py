"""The verify profile timed in interleaved rounds (engine/profile.py ``measure_profile_rounds``)."""

from __future__ import annotations

import pytest

from echo_scheduler.cost import ProfileCost
from echo_scheduler.errors import CostModelError
from echo_server.engine.profile import measure_profile_rounds
from echo_server.model.loader import LoadedModel


def test_one_median_per_token_count_usable_as_a_profile(smollm: LoadedModel) -> None:
    tokens = (1, 3, 6)
    seconds = measure_profile_rounds(smollm.model, tokens, rounds=2)
    assert len(seconds) == len(tokens)
    assert all(s > 0 for s in seconds)
    profile = ProfileCost(tuple(float(t) for t in tokens), tuple(seconds))
    assert profile.latency_at(3) == pytest.approx(seconds[1])


@pytest.mark.parametrize(("tokens", "rounds"), [((1, 4), 0), ((), 3), ((0, 4), 3)])
def test_bad_arguments_are_refused(
    smollm: LoadedModel, tokens: tuple[int, ...], rounds: int
) -> None:
    with pytest.raises(CostModelError, match="rounds >= 1"):
        measure_profile_rounds(smollm.model, tokens, rounds)
