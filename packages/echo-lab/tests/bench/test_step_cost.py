"""``step_over_forward``: a decode step's wall time over the target model's own, by hand."""

from __future__ import annotations

import pytest

from echo_lab.bench.metrics import step_over_forward


def test_every_phase_but_prefill_over_the_forward() -> None:
    phases = {"prefill": 5.0, "draft": 0.5, "schedule": 0.25, "verify": 4.0, "commit": 0.25}
    # (0.5 + 0.25 + 4.0 + 0.25) / 4.0
    assert step_over_forward(phases, 4.0) == pytest.approx(1.25, rel=1e-12)


def test_an_untimed_or_empty_forward_gives_none() -> None:
    assert step_over_forward({"verify": 1.0}, None) is None
    assert step_over_forward({"verify": 1.0}, 0.0) is None
