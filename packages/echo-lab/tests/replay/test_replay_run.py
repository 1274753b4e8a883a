"""The replay command and its parts: rows, gates, arms, paired intervals, the JSON it writes."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from echo_gating.policy import GateMode
from echo_lab.replay.arms import default_arms, optional_arms, select_arms
from echo_lab.replay.cli import main, trace_name
from echo_lab.replay.gates import calibrate_variants, warmup_records
from echo_lab.replay.paired import paired, resample_index
from echo_lab.replay.run import calibrate_rows, compose_steps, drive_arm, split_warmup
from echo_lab.sim.rows import TraceRow, split_rows, stack
from echo_lab.sim.trace import RecordedStep, load_trace
from echo_scheduler.errors import PolicyError, TraceError


def test_gzip_trace_round_trips_and_corrupt_files_are_refused(
    trace_file: Path, tmp_path: Path
) -> None:
    steps = load_trace(trace_file)
    assert len(steps) == 40
    assert steps[0].batch_size == 8
    bad = tmp_path / "trace-bad.json.gz"
    bad.write_bytes(gzip.compress(b'{"format": "echo-trace/1", "steps": 3}'))
    with pytest.raises(TraceError, match="'steps' must be a list"):
        load_trace(bad)
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(bad)


def test_rows_restack_into_the_recorded_step(trace_file: Path) -> None:
    step = load_trace(trace_file)[0]
    again = stack(split_rows(step))
    assert torch.equal(again.pool.token, step.pool.token)
    assert torch.equal(again.pool.parent, step.pool.parent)
    assert torch.equal(again.reachable(0), step.reachable(0))


def test_warmup_split_is_seeded_and_refuses_too_few_rows(rows: list[TraceRow]) -> None:
    a = split_warmup(rows, 0.4, 0)
    assert a == split_warmup(rows, 0.4, 0)
    assert len(a[0]) == int(len(rows) * 0.4)
    with pytest.raises(TraceError, match="at least 100"):
        split_warmup(rows[:50], 0.5, 0)


def test_gate_variants_share_maps_and_differ_only_in_gating(
    make_steps: Callable[[int, int, int], list[RecordedStep]],
) -> None:
    gates = calibrate_variants(warmup_records(make_steps(16, 12, 1)), max_depth=8)
    assert gates["echo"].mode is GateMode.SPARSE
    assert gates["echo_dense"].mode is GateMode.DENSE
    assert gates["echo_fixed"].mode is GateMode.FIXED
    nogate = gates["echo_nogate"]
    assert nogate.mode is GateMode.NONE
    assert not nogate.thresholds
    assert nogate.acceptance_maps is gates["echo"].acceptance_maps
    assert all(g.acceptance_maps is not None for g in gates.values())


def test_baseline_grids_match_depth_to_size_and_names_are_unique() -> None:
    arms = {a.name: a for a in default_arms()}
    assert {"chain/n=1", "chain/n=2", "eagle2/n=1", "eagle2/n=2", "plain", "echo"} <= set(arms)
    one = arms["eagle2/n=1"].config
    assert (one.base_depth, one.topk, one.tree_nodes) == (1, 1, 1)
    assert arms["eagle2/n=4"].config.base_depth == 3
    assert arms["chain/n=2"].budget(16) == 32
    assert all(a.floor == a.family.startswith("echo") for a in arms.values())
    picked = {a.name for a in select_arms(list(arms.values()), ["chain"])}
    assert picked == {a for a in arms if a.startswith("chain")} | {"plain", "echo"}
    with pytest.raises(PolicyError, match="unknown arms"):
        select_arms(list(arms.values()), ["medusa"])


def test_optional_floored_arms_run_only_when_named() -> None:
    every = default_arms() + optional_arms()
    floored = [a for a in optional_arms() if a.name != "echo_device"]
    assert all(a.policy.endswith("+floor") and a.floor for a in floored)
    assert not {a.name for a in optional_arms()} & {a.name for a in select_arms(every, None)}
    picked = {a.name for a in select_arms(every, ["chain/n=2+floor", "echo_k2"])}
    assert picked == {"chain/n=2+floor", "echo_k2", "plain", "echo"}


def test_a_one_node_baseline_verifies_at_most_one_row_per_request(rows: list[TraceRow]) -> None:
    steps = compose_steps(rows, 8, 4, 0)
    for name in ("chain/n=1", "eagle2/n=1"):
        arm = next(a for a in default_arms() if a.name == name)
        series = drive_arm(arm, steps, {})
        assert int(series.verified.max()) <= 8
        assert int(series.calls.max()) == 1  # depth matched to the size: one drafter call


def test_paired_interval_of_an_arm_with_itself_is_a_point() -> None:
    n = torch.tensor([10.0, 12.0, 9.0, 15.0], dtype=torch.float64)
    t = torch.tensor([1.0, 1.1, 0.9, 1.3], dtype=torch.float64)
    idx = resample_index(4, 200, 0)
    same = paired(n, t, n, t, idx)
    assert same.diff == 0.0
    assert same.diff_ci95 == (0.0, 0.0)
    assert same.ratio == 1.0
    faster = paired(n, t / 2, n, t, idx)
    assert faster.ratio == pytest.approx(2.0)
    assert faster.ratio_ci95 == pytest.approx((2.0, 2.0))
    noisy = paired(n + torch.tensor([5.0, 0.0, 0.0, 0.0], dtype=torch.float64), t, n, t, idx)
    assert noisy.diff_ci95[0] < noisy.diff < noisy.diff_ci95[1] or noisy.diff_ci95[0] == 0.0
    assert torch.equal(idx, resample_index(4, 200, 0))


def test_trace_names_come_from_file_names() -> None:
    assert trace_name(Path("traces/trace-humaneval.json.gz")) == "humaneval"
    assert trace_name(Path("my.json")) == "my"


def test_sim_traces_writes_a_row_per_trace_cost_batch_and_arm(
    trace_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    argv = [
        "--traces",
        str(trace_file),
        "--json",
        str(out),
        "--gpu-batches",
        "2",
        "4",
        "--steps",
        "3",
        "--resamples",
        "50",
        "--jobs",
        "1",
        "--calibration-share",
        "0.5",
        "--cost-models",
        "h100-llama8b",
        "h200-qwen235b-tp8",
    ]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "echo-sim-replay/1"
    arms = [a["arm"] for a in doc["arms"]]
    cells = {(r["trace"], r["cost_model"], r["batch"]) for r in doc["rows"]}
    assert cells == {("syn", c, b) for c in ("h100-llama8b", "h200-qwen235b-tp8") for b in (2, 4)}
    for cell in cells:
        got = {
            r["arm"]: r for r in doc["rows"] if (r["trace"], r["cost_model"], r["batch"]) == cell
        }
        assert set(arms) <= set(got)
        assert {"chain*", "static*", "eagle2*", "oracle"} <= set(got)
        for a in arms:
            lo, hi = got[a]["ci95"]
            assert lo <= got[a]["diff_vs_echo"] + 1e-9
            assert got[a]["diff_vs_echo"] <= hi + 1e-9
            assert got[a]["tokens_per_s"] > 0
            assert 0 < got[a]["eta"] <= 1 + 1e-9
        assert got["echo"]["ci95"] == [0.0, 0.0]
    assert "note: cpu: no" in capsys.readouterr().out  # no cost-cpu.json beside the trace
    # the same command gives the same numbers (no wall clock inside)
    again = tmp_path / "again.json"
    assert main([*argv[:3], str(again), *argv[4:]]) == 0
    assert json.loads(again.read_text())["rows"] == doc["rows"]


def test_sim_traces_reports_bad_input_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "trace-none.json"
    assert main(["--traces", str(missing), "--jobs", "1"]) == 2
    assert "cannot read" in capsys.readouterr().err
    ok = tmp_path / "trace-x.json"
    ok.write_text('{"format": "echo-trace/1", "steps": []}')
    assert main(["--traces", str(ok), "--cost-models", "tpu", "--jobs", "1"]) == 2
    assert "unknown cost models" in capsys.readouterr().err


def test_calibrate_rows_stacks_chunks(rows: list[TraceRow]) -> None:
    gates = calibrate_rows(rows[:200], 8)
    assert set(gates) == {
        "echo",
        "echo_nogate",
        "echo_dense",
        "echo_fixed",
        "echo_k2",
        "echo_next_k2",
    }
    assert len(gates["echo_k2"].checkpoints) == 2
