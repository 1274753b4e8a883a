"""The fixed step of two commits side by side on the CPU (a benchmark, not a test):
``python packages/echo-lab/scripts/fixed_step_ab.py --base <commit> [--new <commit>]``.

Each commit is checked out into a temporary git worktree and measured by its own long-lived
child process (its packages first on ``PYTHONPATH``). The two alternate cell by cell for
``--rounds`` rounds, the one going first alternating too, so a noisy spell of a shared VM falls
on both. A child captures the drafted steps of ``--steps`` composed steps per (trace, B) as
``fixed_step_time.py`` does (:func:`echo_lab.replay.fixedstep.capture_steps`: the recorded
traces, the measured H200 cost model), serves each from held price buffers and reports:

- ``ms``: per step, the fastest of ``--reps`` timed runs (after one warm-up, one torch
  thread); the cell's value is the median over its steps. The minimum, not the median, of a
  step's runs: on a shared VM the slow runs are other tenants' time;
  With ``--compiled``, the step served by its shape's ``torch.compile`` (:class:`echo_lab.
  replay.fixedstep.StepGraphs`, compiled when a shape is first seen, untimed) instead;
- ``ops``: the aten ops one (eager) step dispatches (mean over the cell's steps), recorded by
  :class:`echo_core.testing.OpTrace`: deterministic, the same on any CPU.

Each side re-runs its steps with its own commit's code: from ``ac0f57f`` on, a re-run also
makes the expansion decision the policy made at the deepest drafted depth, which earlier
commits skipped, so compare two commits on the same side of it.

Every child also checks that each re-run step selects what it captured. Prints, per cell, each
commit's median over rounds [range] and the per-round ratio new / base: median [range].
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _child(args: argparse.Namespace) -> None:
    """Serve measurements with the packages on this process's path: for every cell name read
    from stdin ("<trace path> <B>"), print one JSON line ``[ms, ops]``."""
    import torch

    from echo_core.testing import OpTrace
    from echo_lab.replay.costs import load_profiled
    from echo_lab.replay.fixedstep import CapturedStep, StepGraphs, capture_steps, run_step
    from echo_scheduler.device.echo_step import StepScalars, layout_rows

    torch.set_num_threads(1)
    cost = load_profiled(args.gpu_cost, "gpu")
    captured: dict[str, list[CapturedStep]] = {}
    graphs = StepGraphs(compiled=True)
    print("ready", flush=True)
    for line in sys.stdin:
        trace, b = line.split()
        if line not in captured:
            captured[line] = capture_steps(Path(trace), int(b), args.steps, cost)
        steps = captured[line]
        if not steps:
            print(json.dumps([0.0, 0.0]), flush=True)
            continue
        rows = layout_rows(steps[0].config, int(b))
        held = StepScalars.of(steps[0].prices, torch.device("cpu"), rows)
        ms, ops = [], []
        for step in steps:
            held.load(step.prices)
            if not torch.equal(run_step(step, held), step.keep):
                raise SystemExit(f"{trace} B={b}: a re-run step selected otherwise")
            if args.compiled:  # its shape's compiled step (compiled on first sight, untimed)
                entry = graphs.prepare(step)
                if not torch.equal(entry.replay(), step.keep):
                    raise SystemExit(f"{trace} B={b}: a compiled step selected otherwise")
                scalars, run = entry.scalars, entry.replay
            else:
                scalars, run = held, functools.partial(run_step, step, held)
            runs = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                scalars.load(step.prices)
                run()
                runs.append(time.perf_counter() - t0)
            ms.append(1e3 * min(runs))
            with OpTrace() as trace_ops:
                held.load(step.prices)
                run_step(step, held)
            ops.append(float(len(trace_ops.ops)))
        print(json.dumps([statistics.median(ms), statistics.mean(ops)]), flush=True)


def _worktree(commit: str, where: Path) -> Path:
    path = where / commit.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(path), commit],
        check=True,
        capture_output=True,
    )
    return path


class _Child:
    """One commit's measuring process (``--child``), fed one cell at a time."""

    def __init__(self, root: Path, argv: list[str]) -> None:
        paths = sorted(str(p) for p in (root / "packages").glob("*/src"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", *argv],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()  # "ready": imports done

    def _read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a measuring process ended (exit {self.proc.wait()})")
        return line

    def measure(self, cell: str) -> list[float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cell + "\n")
        self.proc.stdin.flush()
        result: list[float] = json.loads(self._read())
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", help="the commit to compare against")
    p.add_argument("--new", default=None, help="default: the working tree")
    traces = REPO / "traces"
    p.add_argument("--traces", type=Path, nargs="+", default=sorted(traces.glob("trace-*.json.gz")))
    p.add_argument("--gpu-cost", type=Path, default=traces / "cost-gpu-h200-llama8b.json")
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--steps", type=int, default=20, help="composed steps per cell")
    p.add_argument("--reps", type=int, default=15, help="timed runs per step (the fastest)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--compiled",
        action="store_true",
        help="time each step shape's torch.compile'd step (StepGraphs(compiled=True)) instead "
        "of the eager step; ops stay the eager step's",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    if not args.base:
        p.error("--base is required")
    argv = [
        "--traces", *map(str, args.traces), "--gpu-cost", str(args.gpu_cost),
        "--batches", *map(str, args.batches), "--steps", str(args.steps),
        "--reps", str(args.reps), *(["--compiled"] if args.compiled else []),
    ]  # fmt: skip
    from echo_lab.bench.intervals import cpu_name

    cells = [f"{t} {b}" for t in args.traces for b in args.batches]
    runs: dict[str, dict[str, list[list[float]]]] = {"base": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {"base": _worktree(args.base, Path(tmp))}
        roots["new"] = REPO if args.new is None else _worktree(args.new, Path(tmp))
        children: dict[str, _Child] = {}
        try:
            children = {which: _Child(root, argv) for which, root in roots.items()}
            for r in range(args.rounds):  # per cell, the two alternate (who goes first too)
                for cell in cells:
                    for which in ("base", "new") if r % 2 == 0 else ("new", "base"):
                        runs[which].setdefault(cell, []).append(children[which].measure(cell))
        finally:
            for child in children.values():
                child.close()
            for root in roots.values():
                if root != REPO:
                    subprocess.run(
                        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(root)],
                        check=False,
                        capture_output=True,
                    )
    new_name = args.new or "working tree"
    print(f"# {cpu_name()}, one torch thread; base {args.base}, new {new_name}; "
          f"{args.rounds} interleaved rounds; ms per step: fastest of {args.reps} runs, "
          "median over the cell's steps; then median over rounds [range]")  # fmt: skip
    print(f"{'cell':<14} {'ops base':>8} {'ops new':>8} {'ms base':>22} {'ms new':>22} "
          f"{'new / base':>20}")  # fmt: skip
    for cell in cells:
        base = [m[0] for m in runs["base"][cell]]
        new = [m[0] for m in runs["new"][cell]]
        if not min(base) or not min(new):
            continue  # no drafted step in this cell
        ratio = [n / b for b, n in zip(base, new, strict=True)]
        ops_b, ops_n = runs["base"][cell][0][1], runs["new"][cell][0][1]
        trace, b = cell.split()
        name = f"{Path(trace).name.removeprefix('trace-').split('.')[0]} {b}"
        print(f"{name:<14} {ops_b:>8.0f} {ops_n:>8.0f} {_fmt(base):>22} {_fmt(new):>22} "
              f"{_fmt(ratio):>20}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
