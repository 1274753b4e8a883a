"""Issue #44: on the committed traces, ECHO decided in the fixed layout (``echo_device``) drafts,
verifies and accepts exactly what ``echo`` does, step for step, at B = 16, 64 and 256, with the
floor fed by the measured H200 step model (the replay's ECHO arm)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch

from echo_lab.replay.arms import DEVICE_ARM, default_arms, optional_arms
from echo_lab.replay.costs import load_profiled
from echo_lab.replay.fixedstep import (
    STEEP,
    CapturedStep,
    StepGraphs,
    capture_steps,
    repriced,
    run_step,
)
from echo_lab.replay.run import calibrate_rows, compose_steps, drive_arm, split_warmup
from echo_lab.sim.rows import load_rows
from echo_scheduler.device.echo_step import budget_bucket
from echo_scheduler.errors import PolicyError

TRACES = Path(__file__).resolve().parents[1] / "traces"


@pytest.mark.parametrize("name", ["humaneval", "mtbench", "summarize"])
def test_echo_device_replays_as_echo_on_the_recorded_pools(name: str) -> None:
    cost = load_profiled(TRACES / "cost-gpu-h200-llama8b.json", "gpu")
    warm, rows = split_warmup(load_rows([TRACES / f"trace-{name}.json.gz"]), 0.3, 0)
    gates = calibrate_rows(warm, 8)
    echo = next(a for a in default_arms() if a.name == "echo")
    device = next(a for a in optional_arms() if a.name == DEVICE_ARM)
    for batch in (16, 64, 256):
        steps = compose_steps(rows, batch, 6, 0)
        a = drive_arm(echo, steps, gates, cost)
        b = drive_arm(device, steps, gates, cost)
        assert int(a.calls.sum()) > 0, (name, batch)
        assert int(a.verified.sum()) > 0, (name, batch)
        for field in ("accepted", "verified", "calls", "expansions"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (name, batch, field)
        assert a.request_verified is not None
        assert b.request_verified is not None
        assert torch.equal(a.request_verified, b.request_verified)


def test_one_step_graph_per_shape_serves_every_recorded_step() -> None:
    """:class:`~echo_lab.replay.fixedstep.StepGraphs` on the CPU (the buffers' reload, re-run
    eagerly where CUDA would replay a graph): every captured step of a cell is served by the
    entry of its shape, with its own slabs, caps and prices loaded, and selects what it
    selected in the replay; one entry per number of drafted depths and closing (whether the
    policy folded the deepest depth as the last, or decided there that nothing is expanded)."""
    cost = load_profiled(TRACES / "cost-gpu-h200-llama8b.json", "gpu")
    for batch in (16, 256):
        steps = capture_steps(TRACES / "trace-humaneval.json.gz", batch, 12, cost)
        graphs = StepGraphs()
        served = set()
        for step in steps:
            entry = graphs.prepare(step)
            assert torch.equal(entry.replay(), step.keep), batch
            assert int(entry.scalars.budget) == step.prices.budget
            assert float(entry.scalars.min_utility) == pytest.approx(step.prices.min_utility)
            served.add((entry.scalars.min_utility.data_ptr(), step.prices.min_utility))
        assert graphs.captures == len({(s.depths, s.closed) for s in steps}) < len(steps)
        assert not all(s.closed for s in steps)  # most steps end with nothing to expand
        assert len(served) > graphs.captures  # an entry served steps of different floors
    # a step of another budget bucket gets its own entry; forced into this one, it is refused
    step = steps[0]
    other = dataclasses.replace(step, prices=dataclasses.replace(step.prices, budget=4 * batch))
    assert budget_bucket(other.prices.budget) != budget_bucket(step.prices.budget)
    before = graphs.captures
    graphs.prepare(other)
    assert graphs.captures == before + 1
    with pytest.raises(PolicyError, match="another bucket"):
        graphs.prepare(step).load(other)


def test_a_step_graph_serves_steps_after_the_cost_model_changes() -> None:
    """The graph reads the row price's latency model from its scalars' table, so the steps of a
    cell re-priced by another latency model (a cost-model update: new points, same shapes) are
    served by the entries captured under the first one, and each selects what a fresh step
    under the new model selects; the new model changes some selections."""
    cost = load_profiled(TRACES / "cost-gpu-h200-llama8b.json", "gpu")
    steps = capture_steps(TRACES / "trace-humaneval.json.gz", 64, 12, cost)
    graphs = StepGraphs()
    for step in steps:
        graphs.prepare(step)
    captured = graphs.captures
    assert serve_repriced(graphs, steps) > 0
    assert graphs.captures == captured


# inductor imports torch.jit.script_method, which warns (torch 2.13); the suite makes that an error
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_compiled_step_per_shape_decides_as_the_eager_step() -> None:
    """``StepGraphs(compiled=True)`` on the CPU: one ``torch.compile`` per step shape (whole
    graph: a host read would fail it) serves every captured step of a cell, then the same steps
    re-priced by another latency model, without compiling again, each selecting what the eager
    step selects."""
    from torch._dynamo.utils import counters

    cost = load_profiled(TRACES / "cost-gpu-h200-llama8b.json", "gpu")
    steps = capture_steps(TRACES / "trace-humaneval.json.gz", 16, 8, cost)
    graphs = StepGraphs(compiled=True)
    before = counters["stats"]["unique_graphs"]
    for step in steps:
        assert torch.equal(graphs.run(step), step.keep)
    compiled = counters["stats"]["unique_graphs"] - before
    assert compiled == graphs.captures == len({(s.depths, s.closed) for s in steps})
    assert serve_repriced(graphs, steps) > 0
    assert counters["stats"]["unique_graphs"] - before == compiled
    # every shape compiles its own code object, so no shape meets dynamo's per-code limit
    fns = [inspect.unwrap(e.compiled) for e in graphs.graphs.values() if e.compiled is not None]
    codes = {fn.__code__ for fn in fns}
    assert len(codes) == graphs.captures


def serve_repriced(graphs: StepGraphs, steps: list[CapturedStep]) -> int:
    """Serve every step re-priced by :data:`STEEP` from ``graphs``, asserting each selects what
    a fresh eager step under that model selects; the number of selections the model changed."""
    changed = 0
    for step in steps:
        other = repriced(step, STEEP)
        fresh = run_step(other)
        assert torch.equal(graphs.run(other), fresh)
        changed += not torch.equal(fresh, step.keep)
    return changed
