"""Lockstep rounds: several engines stepped in turn, each timed on its own work only."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from echo_core.sampling import SamplingParams
from echo_lab.bench.harness import ClosedLoop, run_lockstep, step_in_turn
from echo_lab.bench.metrics import steady_rate
from echo_lab.bench.workloads import load_workloads
from echo_lab.cli.bench import _factory
from echo_server.cli import build_parser
from echo_server.engine import Engine
from echo_server.engine.report import StepReport
from echo_server.model.loader import LoadedModel

ARGV = ["bench", "--policies", "plain", "echo", "--workloads", "mtbench", "--num-prompts", "3"]


@pytest.mark.slow
def test_lockstep_steps_every_engine_in_turn_and_clocks_each_alone(smollm: LoadedModel) -> None:
    args = build_parser().parse_args(ARGV)
    workloads = load_workloads(args.workloads, args.num_prompts)
    make = _factory(smollm, args, workloads)
    prompts, greedy = workloads[0].prompts, SamplingParams(temperature=0.0, max_tokens=6)
    turns: list[str] = []

    def spied(policy: str) -> Engine:
        engine: Engine = make(policy, 2)
        step = engine.step

        def counted() -> StepReport:
            turns.append(policy)
            return step()

        engine.step = counted  # type: ignore[method-assign]
        return engine

    loops = [ClosedLoop(spied(p), prompts, 2, greedy, (p, "mtbench")) for p in ("plain", "echo")]
    t0 = time.perf_counter()
    plain, echo = run_lockstep(loops)
    elapsed = time.perf_counter() - t0

    # one step each in turn (the order rotates each turn) until a loop runs out
    n = min(turns.count("plain"), turns.count("echo"))
    for i in range(n):
        assert sorted(turns[2 * i : 2 * i + 2]) == ["echo", "plain"]
    assert plain.outputs == echo.outputs  # greedy speculation is lossless
    assert plain.result.requests == echo.result.requests == 3
    # each loop's clock holds its own work only: the two together fit in the elapsed time
    assert 0 < plain.result.wall_s < elapsed
    assert 0 < echo.result.wall_s < elapsed
    assert plain.result.wall_s + echo.result.wall_s <= elapsed
    assert plain.result.steps == turns.count("plain")
    # 3 prompts at concurrency 2: the third waited through the first steps, which give the
    # busy-slot rate; the drain after it is left out
    for loop, run in zip(loops, (plain, echo), strict=True):
        assert loop.steady is not None
        tokens, clock = loop.steady
        assert 2 <= tokens < run.result.output_tokens
        assert 0 < clock < run.result.wall_s
        assert run.result.steady_tokens_per_s == tokens / clock

    (alone,) = run_lockstep(
        [ClosedLoop(make("plain", 2), prompts, 2, greedy, ("plain", "mtbench"))]
    )
    assert alone.outputs == plain.outputs
    assert alone.result.steps == plain.result.steps
    (everyone,) = run_lockstep(
        [ClosedLoop(make("plain", 3), prompts, 3, greedy, ("plain", "mtbench"))]
    )
    assert everyone.result.steady_tokens_per_s is None  # no prompt ever waited


def test_steady_rate_needs_a_mark_with_time_in_it() -> None:
    assert steady_rate(None) is None
    assert steady_rate((0, 0.0)) is None
    assert steady_rate((12, 3.0)) == 4.0


def test_a_loop_refuses_a_zero_concurrency_and_an_early_finish(smollm: LoadedModel) -> None:
    args = build_parser().parse_args(ARGV)
    workloads = load_workloads(args.workloads, 1)
    make = _factory(smollm, args, workloads)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    with pytest.raises(ValueError, match="concurrency"):
        ClosedLoop(make("plain", 1), workloads[0].prompts, 0, greedy, ("plain", "mtbench"))
    loop = ClosedLoop(make("plain", 1), workloads[0].prompts, 1, greedy, ("plain", "mtbench"))
    assert loop.step()
    with pytest.raises(RuntimeError, match="in flight"):
        loop.finish()
    fresh = ClosedLoop(make("plain", 1), workloads[0].prompts, 1, greedy, ("plain", "mtbench"))
    with pytest.raises(RuntimeError, match="waiting"):
        fresh.finish()  # never stepped


def test_turns_rotate_by_one_and_drop_finished_loops() -> None:
    calls: list[int] = []
    left = [4, 4, 2]  # steps each loop still has

    def stepper(i: int) -> Callable[[], bool]:
        def step() -> bool:
            if left[i] == 0:
                return False
            calls.append(i)
            left[i] -= 1
            return True

        return step

    step_in_turn([stepper(i) for i in range(3)])
    turns = [calls[0:3], calls[3:6], calls[6:8], calls[8:10]]
    # loop 2 has nothing left in the third turn (it would have led): 0 and 1 step, then the
    # fourth turn starts at the second of the two still live
    assert turns == [[0, 1, 2], [1, 2, 0], [0, 1], [1, 0]]
    assert left == [0, 0, 0]
