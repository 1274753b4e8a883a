"""Replay cost models: the roofline's terms, the measured profile's file, and its errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from echo_lab.replay.costs import (
    CPU_COST_FORMAT,
    EAGLE3_HEAD_PARAMS,
    RooflineCost,
    load_profiled,
    roofline_costs,
    save_profiled,
)
from echo_scheduler.cost import Hardware, ModelGeometry, VerifyCostModel
from echo_scheduler.errors import CostModelError


def test_four_roofline_models_with_collectives_only_under_tensor_parallelism() -> None:
    costs = roofline_costs()
    assert sorted(costs) == [
        "h100-llama8b",
        "h100-qwen235b-tp8",
        "h200-llama8b",
        "h200-qwen235b-tp8",
    ]
    llama, qwen = costs["h100-llama8b"], costs["h100-qwen235b-tp8"]
    hinge = VerifyCostModel.roofline(Hardware.h100(), ModelGeometry.llama31_8b(), 64, 1024)
    assert llama.verify_s(64, 100) == pytest.approx(hinge.latency_at(100), rel=1e-12)
    # TP 8 over 94 layers: 2 all-reduces per layer, ring factor 2 * 7/8, hidden 4096 bf16.
    per_row = 2 * 94 * (2 * 7 / 8) * 4096 * 2 / (450e9 * 0.8)
    hinge_q = VerifyCostModel.roofline(Hardware.h100(), ModelGeometry.qwen3_235b_a22b(8), 64, 1024)
    assert qwen.verify_s(64, 100) - hinge_q.latency_at(100) == pytest.approx(100 * per_row)
    # The per-batch latency model the floor and the cut use is the same function, vectorised.
    rows = torch.arange(60, 400, 7)
    for cost in (llama, qwen):
        got = cost.verify_model(64).latency(rows).tolist()
        assert got == [cost.verify_s(64, float(r)) for r in rows.tolist()]


def test_draft_head_roofline_per_call_and_per_node() -> None:
    llama = roofline_costs()["h200-llama8b"]
    kv = 256 * 1024 * 8 * 128 * 2 * 2
    assert llama.per_call_s(1) == pytest.approx((2 * EAGLE3_HEAD_PARAMS + 1024 * 4096) / 3.84e12)
    assert llama.per_call_s(256) == pytest.approx((2 * EAGLE3_HEAD_PARAMS + kv) / 3.84e12)
    assert llama.per_node_s == pytest.approx(2 * EAGLE3_HEAD_PARAMS / (989e12 * 0.6))
    assert llama.draft_s(4, 3, 10) == pytest.approx(3 * llama.per_call_s(4) + 10 * llama.per_node_s)


@pytest.mark.parametrize("name", sorted(roofline_costs()))
def test_verify_cost_never_falls_with_more_rows(name: str) -> None:
    cost = roofline_costs()[name]
    for b in (1, 16, 256):
        times = [cost.verify_s(b, b + k) for k in range(0, 4 * b + 1, max(1, b // 4))]
        assert all(t2 >= t1 for t1, t2 in itertools.pairwise(times))


def test_tp1_has_no_collective_term() -> None:
    hw, geo = Hardware.h100(), ModelGeometry.llama31_8b()
    one = RooflineCost("x", hw, geo, hidden=4096, layers=32)
    eight = RooflineCost("y", hw, geo, hidden=4096, layers=32, tensor_parallel=8)
    assert one.verify_s(8, 40) < eight.verify_s(8, 40)
    assert one.describe()["comm_us_per_row"] == 0.0


def test_profiled_cost_round_trips_and_refuses_unmeasured_batches(tmp_path: Path) -> None:
    path = tmp_path / "cost-cpu.json"
    save_profiled(
        path,
        {1: ([1, 2, 3], [0.02, 0.025, 0.03]), 4: ([4, 8], [0.05, 0.07])},
        1e-3,
        1e-5,
        {"cpu": "test"},
    )
    cost = load_profiled(path)
    assert cost.batch_sizes == (1, 4)
    assert cost.verify_s(1, 2.5) == pytest.approx(0.0275)
    assert cost.draft_s(1, 2, 10) == pytest.approx(2e-3 + 1e-4)
    with pytest.raises(CostModelError, match="batch size 2 was not measured"):
        cost.verify_s(2, 4)


def test_per_batch_draft_costs_replace_the_scalar_pair_where_measured(tmp_path: Path) -> None:
    path = tmp_path / "cost-gpu-x.json"
    verify = {16: ([16, 32], [0.01, 0.012])}
    save_profiled(path, verify, 1e-3, 1e-5, {"device": "test"}, {16: (4e-4, 2e-6)})
    cost = load_profiled(path, "x-measured")
    assert cost.name == "x-measured"
    assert cost.draft_s(16, 3, 100) == pytest.approx(3 * 4e-4 + 100 * 2e-6)
    assert cost.draft_s(1, 3, 100) == pytest.approx(3 * 1e-3 + 100 * 1e-5)  # scalar elsewhere
    assert cost.describe()["draft_by_batch_ms"] == {"16": [0.4, 0.002]}


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps(
            {
                "format": CPU_COST_FORMAT,
                "verify": {"1": {"rows": [1, 2], "seconds": [0.1, 0.2]}},
                "draft": {"per_call_s": 0.0, "per_node_s": 0.0},
                "draft_by_batch": {"1": {"per_call_s": float("nan"), "per_node_s": 0.0}},
            }
        ),
        json.dumps(
            {
                "format": CPU_COST_FORMAT,
                "verify": {"1": {"rows": [1, 2], "seconds": [0.1, 0.2]}},
                "draft": {"per_call_s": 0.0, "per_node_s": 0.0},
                "draft_by_batch": {"1": {"per_call_s": 0.1}},
            }
        ),
        json.dumps(  # a verify batch without its draft costs
            {
                "format": CPU_COST_FORMAT,
                "verify": {
                    "1": {"rows": [1, 2], "seconds": [0.1, 0.2]},
                    "4": {"rows": [4, 8], "seconds": [0.1, 0.2]},
                },
                "draft": {"per_call_s": 0.0, "per_node_s": 0.0},
                "draft_by_batch": {"1": {"per_call_s": 0.1, "per_node_s": 0.0}},
            }
        ),
        json.dumps({"format": "other"}),
        json.dumps({"format": CPU_COST_FORMAT, "verify": {}}),
        json.dumps({"format": CPU_COST_FORMAT, "verify": {"1": {"rows": [1]}}, "draft": {}}),
        json.dumps(
            {
                "format": CPU_COST_FORMAT,
                "verify": {"1": {"rows": [2, 1], "seconds": [0.1, 0.2]}},
                "draft": {"per_call_s": 0.0, "per_node_s": 0.0},
            }
        ),
        json.dumps(
            {
                "format": CPU_COST_FORMAT,
                "verify": {"1": {"rows": [1, 2], "seconds": [0.1, 0.2]}},
                "draft": {"per_call_s": -1.0, "per_node_s": 0.0},
            }
        ),
    ],
)
def test_corrupt_cost_files_get_a_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CostModelError, match=r"bad\.json"):
        load_profiled(path)
