"""The simulator, the recorded-trace replay and the oracle."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from echo_core.tree import empty_tree
from echo_gating.policy import GatePolicy
from echo_lab.sim.compare import (
    depth_price,
    format_table,
    main,
    node_price,
    simulate,
    step_rate,
)
from echo_lab.sim.rows import split_rows
from echo_lab.sim.trace import load_trace, record, save_trace
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import Hardware, ModelGeometry, VerifyCostModel
from echo_scheduler.errors import TraceError
from echo_scheduler.interface import DraftPlan
from echo_scheduler.outcome import accepted_lengths, accepted_mask, oracle_accepted
from echo_scheduler.policies import POLICY_NAMES, make_policy
from echo_scheduler.simulator import DraftCostModel, drive, run_step, summarize
from echo_scheduler.workloads import SyntheticWorkload

TRACE = Path(__file__).parent / "data" / "small_trace.json"
CONFIG = PolicyConfig(max_depth=5, max_width=4)


def test_shipped_trace_replays_through_every_policy() -> None:
    steps = load_trace(TRACE)
    assert len(steps) == 3
    gates = {
        "echo_dense": GatePolicy.dense({1: 0.2, 2: 0.2, 3: 0.1}),
        "echo_fixed": GatePolicy.fixed(0.2, max_depth=5),
    }
    for name in POLICY_NAMES:
        for step in steps:
            for budget in (0, 6, 24, 500):
                policy = make_policy(name, CONFIG, gate=gates.get(name))
                result = run_step(policy, step, budget, CONFIG.draft_width)
                assert result.verified <= budget
                assert result.accepted <= result.own_best <= min(result.verified, result.own_reach)
                assert result.own_reach <= result.reach


def test_replaying_a_recording_reproduces_the_live_run() -> None:
    live = SyntheticWorkload.llama().sample(6, 3, torch.Generator().manual_seed(7))
    recorded = load_trace(TRACE)
    for step, rec in zip(live, recorded, strict=True):
        for name in ("global_topk", "eagle2", "echo"):
            a = drive(make_policy(name, CONFIG), step, 20)
            b = drive(make_policy(name, CONFIG), rec, 20)
            assert torch.equal(a.pool.token, b.pool.token)
            assert torch.equal(a.keep, b.keep)


def test_trace_round_trips_through_json(tmp_path: Path) -> None:
    steps = load_trace(TRACE)
    save_trace(steps, tmp_path / "t.json")
    again = load_trace(tmp_path / "t.json")
    assert torch.equal(again[0].pool.token, steps[0].pool.token)
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(TraceError, match="echo-trace"):
        load_trace(tmp_path / "bad.json")


def test_a_trace_keeps_which_request_and_step_each_row_is(tmp_path: Path) -> None:
    step = load_trace(TRACE)[0]
    b = step.batch_size
    named = replace(step, requests=tuple(f"r{i}" for i in range(b)), request_steps=(3,) * b)
    save_trace([named, step], tmp_path / "t.json.gz")
    again = load_trace(tmp_path / "t.json.gz")
    assert again[0].requests == named.requests
    assert again[0].request_steps == (3,) * b
    assert again[1].requests is None
    assert again[1].request_steps is None
    rows = split_rows(again[0])
    assert [(r.request, r.request_step) for r in rows] == [
        (f"r{i}", 3) for i in range(b) if int(step.pool.cu_nodes[i + 1] - step.pool.cu_nodes[i])
    ]
    good = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))["steps"][0]
    without_steps = {k: v for k, v in good.items() if k != "request_steps"}
    step_zero = {**good, "request_steps": [0] * b}
    too_few = {**good, "requests": good["requests"][:-1]}
    for bad in (without_steps, step_zero, too_few):
        (tmp_path / "bad.json").write_text(json.dumps({"format": "echo-trace/1", "steps": [bad]}))
        with pytest.raises(TraceError, match="request"):
            load_trace(tmp_path / "bad.json")


def test_a_node_is_accepted_iff_its_path_matches_the_target() -> None:
    step = SyntheticWorkload.llama().sample(3, 1, torch.Generator().manual_seed(3))[0]
    rec = record(step, CONFIG)
    hit = accepted_mask(rec.pool, step.target)
    gp = rec.pool.global_parent()
    req = rec.pool.request_index()
    for i in hit.nonzero().flatten().tolist():
        assert int(rec.pool.token[i]) == int(step.target[req[i], rec.pool.depth[i] - 1])
        assert gp[i] < 0 or bool(hit[gp[i]])
    lengths = accepted_lengths(rec.pool, torch.ones_like(hit), step.target)
    assert bool((lengths <= step.reachable(CONFIG.draft_width)).all())


def test_oracle_takes_only_accepted_nodes_up_to_the_budget() -> None:
    assert oracle_accepted(torch.tensor([3, 0, 5]), torch.tensor([10, 10, 2]), 100) == 5
    assert oracle_accepted(torch.tensor([3, 0, 5]), torch.tensor([10, 10, 2]), 4) == 4


def test_drafter_children_depend_only_on_the_node_path() -> None:
    step = SyntheticWorkload.qwen().sample(2, 1, torch.Generator().manual_seed(5))[0]
    pool = empty_tree(2)
    pool_kids = step.draft(pool, DraftPlan.roots(torch.tensor([3, 2])))
    again = step.draft(pool, DraftPlan.roots(torch.tensor([3, 4])))
    assert torch.equal(pool_kids.token[:3], again.token[:3])
    assert torch.equal(pool_kids.draft_logprob[3:5], again.draft_logprob[3:5])


def test_plain_policy_gains_nothing_and_simulated_time_is_positive() -> None:
    steps = SyntheticWorkload.llama().sample(4, 2, torch.Generator().manual_seed(1))
    verify = VerifyCostModel(0.01, 0.0, 1e-4, 100.0)
    plain = summarize(
        [run_step(make_policy("plain"), s, 16, 6) for s in steps], 4, verify, DraftCostModel()
    )
    assert plain.accepted == 0.0
    assert plain.mat == 1.0
    assert plain.tokens_per_s == pytest.approx(4 / 0.01)  # T = 4 roots, below the knee


def test_simulate_prints_a_row_per_policy_and_budget(capsys: pytest.CaptureFixture[str]) -> None:
    rows = simulate(
        SyntheticWorkload.llama(),
        [8],
        2,
        0,
        {8: VerifyCostModel(0.01, 0.0, 1e-4, 64.0)},
        DraftCostModel(),
        ["plain", "eagle2", "echo"],
    )
    assert len(rows) == 9
    assert "echo" in format_table(rows)
    assert main(["--batch-sizes", "8", "--steps", "1", "--policies", "plain", "echo"]) == 0
    assert "select" in capsys.readouterr().out


def test_compare_prices_drafting_per_call_and_per_node() -> None:
    verify = VerifyCostModel.roofline(Hardware.h100(), ModelGeometry.llama31_8b(), 16, 1024)
    draft = DraftCostModel(per_call_s=4e-4, per_node_s=2e-5)
    rate = step_rate(verify, 16, 64)
    assert rate == pytest.approx(32 / verify.latency_at(80))
    assert depth_price(verify, draft, 16, 64) == pytest.approx(4e-4 * rate)
    assert node_price(verify, draft, 16, 64) == pytest.approx(2e-5 * rate)
    # a node price no drafted node can promise stops ECHO's drafting after the roots
    step = load_trace(TRACE)[0]
    free = run_step(make_policy("echo", CONFIG), step, 24, CONFIG.draft_width)
    dear = run_step(make_policy("echo", CONFIG), step, 24, CONFIG.draft_width, node_price=2.0)
    assert free.calls > 1
    assert dear.calls == 1
    assert dear.expansions < free.expansions
