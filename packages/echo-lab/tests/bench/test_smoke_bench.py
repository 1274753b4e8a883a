"""Smoke bench: the real model, 2 prompts, 8 tokens, 2 policies, concurrency 1-2.

Checks the harness end to end (CLI options -> engines -> suite -> JSON, plots, traces), never a
timing: the numbers of such a tiny run mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_lab.bench.plots import available, write_plots
from echo_lab.bench.report import bench_document, check_document, markdown_table, write_json
from echo_lab.bench.suite import SuiteSpec, run_suite
from echo_lab.bench.traces import save_traces
from echo_lab.bench.workloads import load_workloads
from echo_lab.cli.bench import _factory
from echo_server.cli import build_parser
from echo_server.model.loader import LoadedModel

ARGV = [
    "bench",
    "--policies", "plain", "echo",
    "--workloads", "humaneval", "summarize",
    "--num-prompts", "2",
    "--max-tokens", "8",
    "--concurrency", "1", "2",
]  # fmt: skip


@pytest.mark.slow
def test_smoke_bench_writes_a_valid_document(smollm: LoadedModel, tmp_path: Path) -> None:
    args = build_parser().parse_args(ARGV)
    workloads = load_workloads(args.workloads, args.num_prompts)
    spec = SuiteSpec(
        policies=tuple(args.policies),
        concurrency=tuple(args.concurrency),
        max_tokens=args.max_tokens,
        trace_policy="echo",
        rounds=2,
    )
    result = run_suite(_factory(smollm, args, workloads), workloads, spec, progress=False)

    assert len(result.runs) == 2 * 2 * 2  # workloads x concurrency x policies
    assert not result.failures, result.failures
    for run in result.runs:
        assert run.outputs_match is True
        assert run.requests == 2
        assert 0 < run.output_tokens <= 2 * 8
        assert run.speedup is not None
        assert run.speedup > 0
        assert len(run.speedup_rounds) == 2
        assert run.speedup_ci95 is not None
        assert run.speedup_ci95[0] <= run.speedup <= run.speedup_ci95[1]
        assert run.selection is None or 0.0 <= run.selection <= 1.0
        # the model's forward is timed inside the verify phase, so a decode step costs more
        assert run.step_over_forward is not None
        assert run.step_over_forward > 1.0
        assert 0.0 <= run.draft_yield <= 1.0
        assert run.mean_accepted_length >= 1.0
        assert run.request_speedup_min is not None
        assert run.request_speedup_p10 is not None
        assert 0 < run.request_speedup_min <= run.request_speedup_p10
        if run.policy == "plain":
            assert run.longest_passed_over == 0
        # 2 prompts: at concurrency 1 the second waited (a busy-slot rate), at 2 none did
        if run.concurrency == 1:
            assert run.steady_speedup is not None
            assert run.steady_speedup_ci95 is not None
        else:
            assert run.steady_tokens_per_s is None
            assert run.steady_speedup is None
    assert "| humaneval | 1 | plain |" in markdown_table(result.runs)

    path = tmp_path / "bench.json"
    write_json(bench_document(result, {"argv": ARGV}, None, 1.0), path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert check_document(doc) == []
    assert {r["policy"] for r in doc["runs"]} == {"plain", "echo"}

    traces = save_traces(result.traces, tmp_path)
    assert {p.name for p in traces} <= {"trace-humaneval.json", "trace-summarize.json"}
    if available():
        names = {p.name for p in write_plots(result, tmp_path)}
        assert {"throughput.png", "draft_yield.png"} <= names


def test_check_document_names_missing_fields() -> None:
    doc = {"schema": "echo-bench/1", "runs": [{"policy": "plain"}]}
    problems = check_document(doc)
    assert len(problems) == 1
    assert "speedup" in problems[0]
