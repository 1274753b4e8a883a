"""echo_vs_best on hand-made rows: the best other arm per column and the break-even host time."""

from __future__ import annotations

import pytest

from echo_lab.replay.hosttime import HostRow, echo_vs_best


def _row(arm: str, host_ms: float, gpu_rate: float, serial_rate: float) -> HostRow:
    return HostRow("t", 16, arm, host_ms, host_ms, 10.0, 1.0, gpu_rate, serial_rate)


def test_each_column_picks_its_own_best_arm_and_the_break_even_prices_the_median_step() -> None:
    rows = [
        _row("echo", 2.0, 1100.0, 900.0),
        _row("wide", 1.0, 1050.0, 950.0),  # best GPU-only among the others
        _row("lean", 0.1, 1000.0, 990.0),  # best host-serial among the others
    ]
    (cell,) = echo_vs_best(rows)
    assert cell["gpu_best"] == "wide"
    assert cell["gpu_only"] == pytest.approx(1100.0 / 1050.0, abs=1e-4)
    assert cell["serial_best"] == "lean"
    assert cell["host_serial"] == pytest.approx(900.0 / 990.0, abs=1e-4)
    # g (R_gpu / R_best - 1) = 10 ms * (1100 / 990 - 1) = 1.111 ms
    assert cell["break_even_ms"] == pytest.approx(10.0 * (1100.0 / 990.0 - 1), abs=1e-3)


def test_cells_without_echo_or_without_another_arm_are_skipped() -> None:
    assert echo_vs_best([_row("lean", 0.1, 1000.0, 990.0)]) == []
    assert echo_vs_best([_row("echo", 2.0, 1100.0, 900.0)]) == []
