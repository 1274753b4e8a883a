"""The hindsight oracle: the run-rate optimum (checked by brute force) and a bound on every arm."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from echo_lab.replay.costs import ProfiledCost, roofline_costs
from echo_lab.replay.hindsight import oracle_run, step_options
from echo_scheduler.cost import ProfileCost


def _cpu_like() -> ProfiledCost:
    """A concave CPU-like profile at B = 2 (the first extra rows cost the most)."""
    profile = ProfileCost((2.0, 4.0, 8.0, 20.0), (0.050, 0.062, 0.070, 0.110))
    return ProfiledCost("cpu", {2: profile}, per_call_s=0.004, per_node_s=0.0002, machine={})


def test_options_draft_shallowest_first() -> None:
    tokens, seconds, calls = step_options(torch.tensor([3, 1]), _cpu_like())
    assert tokens.tolist() == [2, 3, 4, 5, 6]
    # k = 1, 2 need one depth (both requests' first tokens), k = 3 two, k = 4 three.
    assert calls.tolist() == [0, 1, 1, 2, 3]
    assert seconds[0] == pytest.approx(0.050)
    assert seconds[2] == pytest.approx(0.004 + 2 * 0.0002 + 0.062)


def test_oracle_maximises_the_run_rate_exactly() -> None:
    cost = _cpu_like()
    reaches = [
        torch.tensor([3, 1]),
        torch.tensor([0, 0]),
        torch.tensor([5, 4]),
        torch.tensor([1, 2]),
    ]
    opts = [step_options(r, cost) for r in reaches]
    best = 0.0
    for picks in itertools.product(*(range(o[0].numel()) for o in opts)):
        n = sum(float(o[0][p]) for o, p in zip(opts, picks, strict=True))
        t = sum(float(o[1][p]) for o, p in zip(opts, picks, strict=True))
        best = max(best, n / t)
    assert oracle_run(reaches, cost).tokens_per_s == pytest.approx(best, rel=1e-12)


def test_oracle_is_plain_decoding_when_nothing_is_reachable() -> None:
    cost = roofline_costs()["h100-llama8b"]
    run = oracle_run([torch.zeros(4, dtype=torch.int64)] * 3, cost)
    assert run.accepted.tolist() == [0, 0, 0]
    assert run.tokens_per_s == pytest.approx(4 / cost.verify_s(4, 4))


def test_no_arm_beats_the_oracle(trace_file: Path) -> None:
    from echo_lab.replay.arms import default_arms
    from echo_lab.replay.run import (
        ReplaySpec,
        calibrate_rows,
        compose_steps,
        replay_cell,
        split_warmup,
    )
    from echo_lab.sim.rows import load_rows

    warm, evaluation = split_warmup(load_rows([trace_file]), 0.5, 0)
    gates = calibrate_rows(warm, 8)
    steps = compose_steps(evaluation, 4, 6, 0)
    costs = list(roofline_costs().values())
    tuning = compose_steps(warm, 4, 2, 1)
    spec = ReplaySpec(resamples=50)
    rows = replay_cell("syn", steps, gates, default_arms(), costs, spec, tuning)
    assert {r["gate_choice"] for r in rows if r["arm"] == "echo_utility"}  # one per cost model
    for r in rows:
        assert 0.0 <= r["eta"] <= 1.0 + 1e-9, r
        if "coverage" in r:
            assert 0.0 <= r["coverage"] <= 1.0 + 1e-9
            assert 0.0 <= r["selection"] <= 1.0 + 1e-9
            assert r["eta"] == pytest.approx(r["token_share"] * r["time_share"], rel=1e-9)
