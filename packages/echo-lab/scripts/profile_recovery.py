"""ECHO started from a wrong verify profile against ECHO started from a clean one (issue #47).

The start-up profile is checked (engine/profile_store.py), but a profile can pass every check
and still be wrong: taken on a quieter machine, before a clock change, or planted. The engine
then corrects itself from its own verify passes (engine/cost_feedback.py). This script measures
how fast and how well:

1. The clean profile is measured now (``profile_store.checked_profile`` into a temporary cache
   directory; it is printed, with its source: fresh, or unsettled if the machine never settled).
2. Wrong profiles are derived from it and cached, each in its own directory, in the checked
   format with this machine's identity and every round equal to the medians, so that they pass
   the start-up checks and only the live correction can undo them:

   - ``dear``: every draft row priced at half a one-row pass on top of the clean curve,
     ``p_dear(T) = p(T) + 0.5 * p(1) * (T - 1)``: ECHO thinks drafting is expensive and stops;
   - ``cheap``: every pass priced as one row, ``p_cheap(T) = p(1)``: ECHO thinks draft rows are
     free and verifies as many as its budget allows.

3. For each concurrency, in ``--rounds`` rounds, one new ECHO engine per arm (``clean`` and
   every wrong one; new engines each round, so every round starts from the planted profile) runs
   the same closed loop of prompts (HumanEval and MT-Bench first turns, alternating), the
   engines stepped in lockstep with the order rotated every turn (echo_lab.bench.harness).

Per arm and round it takes the throughput over the same stretch of work in every arm: output
tokens ``S`` to ``E`` over the arm's own seconds between producing them, with ``S`` the tokens the
clean arm had produced after ``--skip`` steps and ``E`` the fewest any arm had produced while
every slot was still busy (the queue not yet drained). A cut by step count would compare
different work, since the arms take different numbers of steps for the same prompts (at c = 1
steps >= 200 are the last two prompts of one arm and the last three of another). It prints per
wrong arm the ratio to the clean arm's (median over rounds, t-interval:
echo_lab.bench.intervals.round_ratio), the step at which the engine first put a corrected curve
in use (``CostSnapshot.swaps``), and whether every output equalled the clean arm's token for
token (greedy).

    .venv/bin/python packages/echo-lab/scripts/profile_recovery.py --concurrency 1 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from echo_controller.logs import configure_logging
from echo_core.sampling import SamplingParams
from echo_lab.bench.harness import ClosedLoop, step_in_turn
from echo_lab.bench.intervals import cpu_name, rotated, round_ratio
from echo_scheduler.cost import ProfileCost
from echo_scheduler.profile_check import ProfileRounds, check_profile
from echo_server.cli import build_parser
from echo_server.cli.options import build_engine, load
from echo_server.engine import profile_store
from echo_server.engine.profile import PROFILE_ROUNDS
from echo_server.engine.profile_store import CheckedProfile, ProfileSource
from echo_server.model.llama import LlamaModel
from echo_server.prompts import Prompt, humaneval, mtbench

WRONG = ("dear", "cheap")


def wrong_seconds(kind: str, tokens: tuple[int, ...], seconds: tuple[float, ...]) -> list[float]:
    """The wrong curve ``kind`` derived from the clean one (module docstring)."""
    one = seconds[0]
    if kind == "dear":
        return [s + 0.5 * one * (t - 1) for t, s in zip(tokens, seconds, strict=True)]
    if kind == "cheap":
        return [one for _ in tokens]
    raise ValueError(f"unknown wrong profile {kind!r}")


def plant(
    model: LlamaModel, directory: Path, seconds: list[float], tokens: tuple[int, ...]
) -> None:
    """Cache ``seconds`` for ``model`` in ``directory`` as a checked profile that passes."""
    rounds = ProfileRounds(
        tokens, tuple((s,) * PROFILE_ROUNDS for s in seconds), (seconds[0], seconds[0])
    )
    check = check_profile(rounds)
    if not check.ok:
        raise RuntimeError(f"the planted profile fails its own checks: {check.reasons}")
    profile = ProfileCost(tuple(float(t) for t in tokens), tuple(seconds))
    planted = CheckedProfile(profile, ProfileSource.FRESH, rounds, check, attempts=1)
    path = profile_store.cache_path(model, directory)
    assert path is not None
    profile_store.save(path, profile_store.machine_identity(model), planted)


@dataclass
class Trace:
    """One arm's run: per step its seconds, tokens, whether every slot was busy, swaps so far."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    busy: list[bool] = field(default_factory=list)
    swaps: list[int] = field(default_factory=list)

    def tokens_after(self, steps: int) -> int:
        """Output tokens produced by the first ``steps`` steps."""
        return sum(self.tokens[:steps])

    def busy_tokens(self) -> int:
        """Output tokens produced by the last step that began with every slot busy."""
        last = max((i for i, b in enumerate(self.busy) if b), default=-1)
        return sum(self.tokens[: last + 1])

    def seconds_at(self, tokens: float) -> float:
        """The arm's own seconds when its output reached ``tokens`` tokens, interpolated
        linearly within the step that crossed it."""
        done, wall = 0, 0.0
        for n, s in zip(self.tokens, self.seconds, strict=True):
            if n and done + n >= tokens:
                return wall + s * (tokens - done) / n
            done, wall = done + n, wall + s
        raise RuntimeError(f"the arm produced {done} tokens, fewer than {tokens}")

    def rate(self, start: int, end: int) -> float:
        """Output tokens per second from token ``start`` to token ``end``."""
        if end <= start:
            raise RuntimeError(f"no work left after token {start}: give more prompts")
        return (end - start) / (self.seconds_at(end) - self.seconds_at(start))

    def first_swap(self) -> int | None:
        return next((i for i, s in enumerate(self.swaps) if s > 0), None)


def traced_step(loop: ClosedLoop, trace: Trace) -> bool:
    """``loop.step()``, recording the step into ``trace``."""
    wall, tokens, busy = loop.wall, loop.tokens, bool(loop.queue)
    if not loop.step():
        return False
    trace.seconds.append(loop.wall - wall)
    trace.tokens.append(loop.tokens - tokens)
    trace.busy.append(busy)
    feedback = loop.engine.cost_feedback
    trace.swaps.append(feedback.snapshot.swaps)
    return True


def prompts_for(n: int) -> list[Prompt]:
    """``n`` HumanEval and ``n`` MT-Bench first turns, alternating."""
    out: list[Prompt] = []
    for a, b in zip(humaneval(n), mtbench(n), strict=True):
        out += [a, b]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip", type=int, default=200, help="steps before the throughput counts")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts-per-slot", type=int, default=10, help="prompts per concurrency slot")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    configure_logging("info")
    torch.set_num_threads(a.threads)
    args = build_parser().parse_args(["demo", "--threads", str(a.threads)])
    loaded = load(args)
    model = loaded.model
    tmp = Path(tempfile.mkdtemp(prefix="echo-profile-recovery-"))
    dirs = {"clean": tmp / "clean", **{w: tmp / w for w in WRONG}}
    clean = profile_store.checked_profile(model, dirs["clean"])
    tokens, seconds = clean.rounds.tokens, clean.profile.seconds
    print(f"cpu {cpu_name()}, {torch.get_num_threads()} torch thread(s)")
    print(f"clean profile ({clean.source.value}, {clean.attempts} attempt(s)), ms per T:")
    print("  " + "  ".join(f"{t}:{s * 1e3:.1f}" for t, s in zip(tokens, seconds, strict=True)))
    for kind in WRONG:
        wrong = wrong_seconds(kind, tokens, seconds)
        plant(model, dirs[kind], wrong, tokens)
        print(
            f"{kind:<6} planted: "
            + "  ".join(f"{t}:{s * 1e3:.1f}" for t, s in zip(tokens, wrong, strict=True))
        )
    arms = list(dirs)
    sampling = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    ok = True
    for conc in a.concurrency:
        prompts = prompts_for(max(1, (conc * a.prompts_per_slot + 1) // 2))
        ns = argparse.Namespace(**{**vars(args), "max_batch": conc})
        rates: dict[str, list[float]] = {arm: [] for arm in arms}
        swaps: dict[str, list[int | None]] = {arm: [] for arm in arms}
        steps: dict[str, list[int]] = {arm: [] for arm in arms}
        for r in range(a.rounds):
            order = rotated(arms, r)
            loops, traces = {}, {arm: Trace() for arm in arms}
            for arm in order:
                ns.profile_cache = dirs[arm]
                engine = build_engine(loaded, "echo", ns)
                loops[arm] = ClosedLoop(engine, prompts, conc, sampling, (arm, "mixed"))
            step_in_turn([partial(traced_step, loops[arm], traces[arm]) for arm in order])
            outs = {arm: loops[arm].finish().outputs for arm in arms}
            start = traces["clean"].tokens_after(a.skip)
            end = min(t.busy_tokens() for t in traces.values())
            for arm in arms:
                rates[arm].append(traces[arm].rate(start, end))
                swaps[arm].append(traces[arm].first_swap())
                steps[arm].append(len(traces[arm].seconds))
                if outs[arm] != outs["clean"]:
                    ok = False
                    print(f"  c={conc} round {r + 1}: {arm}'s outputs differ from clean's")
            print(
                f"  c={conc} round {r + 1}: "
                + ", ".join(f"{arm} {rates[arm][-1]:.1f} tok/s" for arm in arms)
                + f" (output tokens {start}-{end})"
            )
        print(f"\nc = {conc}: {len(prompts)} prompts, max {a.max_tokens} tokens, {a.rounds} rounds")
        print(
            f"  clean  {statistics.median(rates['clean']):.1f} tok/s after its step {a.skip} "
            f"(steps per run {steps['clean']})"
        )
        for kind in WRONG:
            ratio = round_ratio([w / c for w, c in zip(rates[kind], rates["clean"], strict=True)])
            print(
                f"  {kind:<6} {ratio.describe()} of clean; first corrected curve at step "
                f"{swaps[kind]} (steps per run {steps[kind]})"
            )
    print(f"\nidentical outputs: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
