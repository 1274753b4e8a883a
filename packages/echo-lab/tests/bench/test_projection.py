"""Traces split into rows, recomposed into large batches, projected (synthetic rows, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from echo_lab.bench.projection import ProjectionSpec, project, projection_tables
from echo_lab.bench.traces import TraceRow, compose, load_rows, save_traces, split_rows
from echo_lab.sim.trace import record
from echo_scheduler.config import PolicyConfig
from echo_scheduler.workloads import SyntheticWorkload


def _rows(n_steps: int = 6, batch: int = 32) -> list[TraceRow]:
    g = torch.Generator().manual_seed(0)
    steps = SyntheticWorkload.llama().sample(batch, n_steps, g)
    config = PolicyConfig.high_concurrency()
    return [row for s in steps for row in split_rows(record(s, config))]


def test_rows_round_trip_through_a_trace_file(tmp_path: Path) -> None:
    rows = _rows(1, 4)
    step = compose(rows, 4, torch.Generator().manual_seed(1))
    paths = save_traces({"w": [step]}, tmp_path)
    assert [p.name for p in paths] == ["trace-w.json"]
    again = load_rows(paths)
    assert len(again) == 4
    shape = {tuple((t, p) for t, p, _ in r.nodes) for r in rows}
    assert {tuple((t, p) for t, p, _ in r.nodes) for r in again} <= shape


def test_composed_step_has_the_requested_batch_size() -> None:
    step = compose(_rows(1, 4), 9, torch.Generator().manual_seed(0))
    assert step.batch_size == 9
    assert step.target.shape[0] == 9


def test_projection_reports_every_point_and_the_paper_margin() -> None:
    spec = ProjectionSpec(batches=(64,), steps=1, policies=("plain", "eagle2", "echo"))
    doc = project(_rows(), spec)
    points = doc["points"]
    assert len(points) == 2 * 2 * 2 * 3  # hardware x model x budget x policy
    assert all(p["tokens_per_s"] > 0 for p in points)
    assert {m["model"] for m in doc["margins"]} == {"Llama-3.1-8B", "Qwen3-235B-A22B"}
    assert "ECHO margin" in projection_tables(doc)


def test_cli_projects_saved_traces(tmp_path: Path) -> None:
    from echo_server.cli import main

    g = torch.Generator().manual_seed(0)
    steps = [record(s, PolicyConfig()) for s in SyntheticWorkload.llama().sample(32, 4, g)]
    trace = save_traces({"syn": steps}, tmp_path)[0]
    out = tmp_path / "proj.json"
    argv = ["bench", "--project-only", str(trace), "--projection-batches", "16"]
    assert main([*argv, "--projection-steps", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["projection"]["spec"]["batches"] == [16]
