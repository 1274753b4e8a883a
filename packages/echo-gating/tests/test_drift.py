"""Drift monitor: quiet on calibration-like traffic, alarmed by a shift, and pool observations."""

from __future__ import annotations

import math

import pytest
import torch

from echo_core.random_trees import random_tree_batch
from echo_core.tree import TreeBatch, empty_tree
from echo_gating.calibrate import CalibrationConfig, calibrate_gates, calibration_report
from echo_gating.drift import DriftConfig, DriftMonitor, gate_observations
from echo_gating.errors import GatingError
from echo_gating.policy import GatePolicy
from echo_gating.records import GateSamples, gate_samples
from echo_gating.testing import SyntheticSpec, synthetic_records

SPEC = SyntheticSpec()


def live(spec: SyntheticSpec, seed: int, steps: int) -> GateSamples:
    return gate_samples(synthetic_records(spec, torch.Generator().manual_seed(seed), steps, 1))


@pytest.fixture(scope="module")
def policy() -> GatePolicy:
    records = synthetic_records(SPEC, torch.Generator().manual_seed(1), 500, 8)
    return calibration_report(records, CalibrationConfig()).policy


def feed(monitor: DriftMonitor, samples: GateSamples, batches: int = 8) -> None:
    for part in torch.arange(len(samples)).chunk(batches):
        monitor.observe(samples.depth[part], samples.confidence[part], samples.accepted[part])


def test_calibration_like_traffic_raises_no_alarm(policy: GatePolicy) -> None:
    monitor = DriftMonitor(policy, DriftConfig(window=512))
    feed(monitor, live(SPEC, 2, 3000))
    report = monitor.check()
    assert not report.recalibrate
    assert report.reason is None
    assert len(report.depths) == SPEC.max_depth
    for h in report.depths:
        assert h.samples == 512
        assert abs(h.calibration_error) <= h.band
    first = report.depths[0]
    assert 0.0 < first.truncated < 0.5
    assert math.isnan(report.depths[4].truncated)  # depth 5 is not a checkpoint
    metrics = report.metrics()
    assert metrics["recalibrate"] == 0.0
    assert "depth2.calibration_error" in metrics


def test_weaker_drafter_triggers_recalibration_with_a_reason(policy: GatePolicy) -> None:
    weaker = SyntheticSpec(continue_prob=(0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5))
    monitor = DriftMonitor(policy, DriftConfig(window=512, patience=3))
    feed(monitor, live(weaker, 3, 512 * 2))
    assert not monitor.check().recalibrate  # two failed windows: not yet
    feed(monitor, live(weaker, 4, 512))
    report = monitor.check()
    assert report.recalibrate
    assert report.reason is not None
    assert "depth 2: realised acceptance" in report.reason
    assert "in 3 consecutive windows" in report.reason
    # A recalibration from the live window (no need to stop serving) sees the new regime.
    fresh = calibrate_gates(monitor.window(), CalibrationConfig(label="live"))
    assert fresh.policy.reference[1].accept_rate < policy.reference[1].accept_rate - 0.15


def test_a_passing_window_resets_the_strikes(policy: GatePolicy) -> None:
    weaker = SyntheticSpec(continue_prob=(0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5))
    monitor = DriftMonitor(policy, DriftConfig(window=512, patience=2))
    feed(monitor, live(weaker, 5, 512))
    feed(monitor, live(SPEC, 6, 512))
    feed(monitor, live(weaker, 7, 512))
    assert not monitor.check().recalibrate


def test_gate_auc_collapse_is_reported(policy: GatePolicy) -> None:
    # Same acceptance rates, but confidence no longer tells accepted from rejected.
    blind = SyntheticSpec(separation=(0.0,) * 8)
    monitor = DriftMonitor(policy, DriftConfig(window=512, patience=1, tolerance=1.0))
    feed(monitor, live(blind, 8, 600))
    report = monitor.check()
    assert report.recalibrate
    assert report.reason is not None
    assert "gate AUC" in report.reason


def test_policy_without_maps_uses_reference_rates_or_nothing() -> None:
    monitor = DriftMonitor(GatePolicy.none(max_depth=2), DriftConfig(window=64, min_samples=8))
    monitor.observe(torch.tensor([1] * 10), torch.rand(10), torch.rand(10) < 0.5)
    h = monitor.check().depths[0]
    assert math.isnan(h.predicted)
    assert h.problem is None


def brute_observations(pool: TreeBatch, accepted: torch.Tensor) -> list[tuple[int, float, bool]]:
    out = []
    for b in range(pool.batch_size):
        lo, hi = int(pool.cu_nodes[b]), int(pool.cu_nodes[b + 1])
        for d in sorted({int(pool.depth[i]) for i in range(lo, hi)}):
            cell = [i for i in range(lo, hi) if int(pool.depth[i]) == d]
            conf = max(math.exp(float(pool.path_logprob[i])) for i in cell)
            out.append((d, conf, any(bool(accepted[i]) for i in cell)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_gate_observations_match_brute_force(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pool = random_tree_batch(g, 5, 9)
    accepted = torch.rand(pool.num_nodes, generator=g) < 0.4
    obs = gate_observations(pool, accepted)
    want = brute_observations(pool, accepted)
    assert obs.depth.tolist() == [d for d, _, _ in want]
    torch.testing.assert_close(obs.confidence, torch.tensor([c for _, c, _ in want]))
    assert obs.accepted.tolist() == [a for _, _, a in want]


def test_gate_observations_of_an_empty_pool() -> None:
    obs = gate_observations(empty_tree(3), torch.zeros(0, dtype=torch.bool))
    assert len(obs) == 0
    with pytest.raises(GatingError, match="accepted must be"):
        gate_observations(empty_tree(1), torch.zeros(2, dtype=torch.bool))
    with pytest.raises(GatingError, match="table must be"):
        gate_observations(empty_tree(1), torch.zeros(0, dtype=torch.bool), torch.zeros(1, 3))


def test_observe_checks_its_inputs(policy: GatePolicy) -> None:
    monitor = DriftMonitor(policy)
    with pytest.raises(GatingError, match="all be"):
        monitor.observe(torch.tensor([1]), torch.rand(2), torch.tensor([True]))
    with pytest.raises(GatingError, match="int64 depth and bool"):
        monitor.observe(torch.tensor([1]), torch.rand(1), torch.tensor([1]))
    with pytest.raises(GatingError, match="window"):
        DriftConfig(window=0)
