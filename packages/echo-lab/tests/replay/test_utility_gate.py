"""echo_utility: gates chosen by simulated net utility on warm-up steps (replay.utility)."""

from __future__ import annotations

import pytest
import torch

from echo_gating.policy import GateMode, GatePolicy
from echo_gating.signals import gate_signal
from echo_lab.replay.arms import UTILITY_ARM, default_arms
from echo_lab.replay.costs import roofline_costs
from echo_lab.replay.run import (
    ReplaySpec,
    calibrate_rows,
    compose_steps,
    replay_cell,
    split_warmup,
    utility_gate,
)
from echo_lab.replay.utility import (
    MIN_GAIN,
    UTILITY_DEPTHS,
    UTILITY_SHARES,
    UTILITY_SIGNALS,
    candidate_gates,
    choose_gate,
)
from echo_lab.sim.rows import TraceRow
from echo_scheduler.errors import TraceError


def test_candidates_are_one_checkpoint_at_signal_quantiles(rows: list[TraceRow]) -> None:
    gates = calibrate_rows(rows[:200], 8)
    tuning = compose_steps(rows[200:], 8, 3, 0)
    cands = candidate_gates(gates["echo_nogate"], tuning)
    assert next(iter(cands)) == "none"
    assert cands["none"] is gates["echo_nogate"]
    want = {
        f"{s}@{d}:q={q:g}" for s in UTILITY_SIGNALS for d in UTILITY_DEPTHS for q in UTILITY_SHARES
    }
    assert set(cands) == {"none"} | want
    for label, gate in cands.items():
        if label == "none":
            continue
        signal, rest = label.split("@")
        d, q = int(rest.split(":")[0]), float(rest.split("=")[1])
        assert gate.mode is GateMode.SPARSE
        assert gate.signal == signal
        assert gate.checkpoints == (d,)
        assert gate.acceptance_maps is gates["echo_nogate"].acceptance_maps  # same key and cut
        parts = []
        for st in tuning:
            reached = torch.bincount(
                st.pool.request_index()[st.pool.depth == d], minlength=st.batch_size
            )
            parts.append(gate_signal(st.pool, d, signal)[reached > 0])
        values = torch.cat(parts)
        below = float((values < gate.thresholds[d]).float().mean())
        assert below <= q + 1e-6  # the q-quantile truncates at most a share q of them


def test_a_checkpoint_must_beat_no_checkpoint_by_the_margin() -> None:
    cands = {k: GatePolicy.none(version=k) for k in ("none", "a", "b")}
    rates = {"none": 100.0, "a": 100.0 * (1 + MIN_GAIN / 2), "b": 99.0}
    pick = choose_gate(cands, lambda g: rates[g.version])
    assert pick.label == "none"
    assert pick.gain == 1.0
    rates["b"] = 100.0 * (1 + 2 * MIN_GAIN)
    pick = choose_gate(cands, lambda g: rates[g.version])
    assert pick.label == "b"
    assert pick.gate is cands["b"]
    assert pick.gain == pytest.approx(1 + 2 * MIN_GAIN)
    assert pick.rates == rates


def test_the_choice_uses_warmup_steps_only_and_is_reproducible(rows: list[TraceRow]) -> None:
    warm, evaluation = split_warmup(rows, 0.5, 0)
    gates = calibrate_rows(warm, 8)
    arm = next(a for a in default_arms() if a.name == UTILITY_ARM)
    cost = roofline_costs()["h100-llama8b"]
    tuning = compose_steps(warm, 16, 3, 1)
    first = utility_gate(arm, tuning, gates, cost)
    assert first.label in first.rates
    assert utility_gate(arm, tuning, gates, cost).label == first.label
    assert first.gain >= 1.0
    steps = compose_steps(evaluation, 16, 3, 0)
    with pytest.raises(TraceError, match="needs tuning steps"):
        replay_cell("syn", steps, gates, [arm], [cost], ReplaySpec(resamples=20))
    got = replay_cell("syn", steps, gates, [arm], [cost], ReplaySpec(resamples=20), tuning)
    (row,) = [r for r in got if r["arm"] == UTILITY_ARM]
    assert row["gate_choice"] == first.label
    assert row["tuning_gain"] == pytest.approx(first.gain)
