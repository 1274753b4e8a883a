"""The committed trace set (traces/) loads and replays: the README's ``echo-sd sim --traces``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_lab.replay.cli import main
from echo_lab.replay.costs import load_profiled
from echo_lab.sim.trace import load_trace

TRACES = Path(__file__).resolve().parents[1] / "traces"
FILES = sorted(TRACES.glob("trace-*.json.gz"))
MAX_BYTES = 20 * 2**20


def test_the_trace_set_is_complete_and_small() -> None:
    assert [p.name for p in FILES] == [
        "trace-humaneval.json.gz",
        "trace-mtbench.json.gz",
        "trace-summarize.json.gz",
    ]
    assert sum(p.stat().st_size for p in TRACES.iterdir()) <= MAX_BYTES
    cpu = load_profiled(TRACES / "cost-cpu.json")
    assert set(cpu.batch_sizes) >= {1, 4, 16}
    assert cpu.machine["threads"] == 1
    assert cpu.machine["cpu"]
    gpu = load_profiled(TRACES / "cost-gpu-h200-llama8b.json")
    assert set(gpu.batch_sizes) >= {16, 64, 256}
    assert "H200" in gpu.machine["device"]
    assert set(gpu.draft_by_batch) >= {16, 64, 256}


@pytest.mark.slow
def test_every_committed_trace_replays_under_the_cpu_and_a_gpu_model(tmp_path: Path) -> None:
    steps = load_trace(FILES[0])
    assert steps
    assert all(s.pool.max_depth() <= 8 for s in steps)
    out = tmp_path / "sim.json"
    argv = ["--traces", *map(str, FILES), "--json", str(out), "--steps", "2",
            "--cpu-batches", "4", "--gpu-batches", "16", "--resamples", "20", "--jobs", "1",
            "--cost-models", "cpu", "h200-qwen235b-tp8", "h200-llama8b-measured",
            "--arms", "echo", "chain"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    cells = {(r["trace"], r["cost_model"], r["batch"]) for r in rows}
    assert cells == {
        (t, c, b)
        for t in ("humaneval", "mtbench", "summarize")
        for c, b in (("cpu", 4), ("h200-qwen235b-tp8", 16), ("h200-llama8b-measured", 16))
    }
    assert all(0 < r["eta"] <= 1 + 1e-9 for r in rows)
