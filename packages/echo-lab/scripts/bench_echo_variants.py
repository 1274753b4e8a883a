"""Variants of ECHO against plain decoding in lockstep rounds, in one process.

Arms (every one the embedded default engine; only the named piece differs):

- ``echo``: the shipped ledger. A drafted step is charged its measured draft-phase seconds at the
  run rate (``StepOutcome.draft_s``), with the upper-bound decision (``z = 1``).
- ``echo-z0``: the same, deciding on the mean value (``z = 0``), no optimism.
- ``echo-priced``: the ledger before measured drafting: the engine's draft time is withheld, so
  a drafted step is charged the fitted per-call and per-node prices.
- ``echo-rows``: the shipped ECHO with draft rows priced at their own fitted scale even below
  the whole verify pass's (``ElasticFloor(row_floor=0.25)``; the shipped floor never prices a
  row below the pass's scale ``s``, echo_scheduler.elastic).
- Profile arms (``PROFILE_ARMS``: token counts, interleaved rounds, the floor's slope window;
  each profile timed once per process with engine/budget.py ``measure_profile_rounds`` and
  printed): the shipped ECHO priced by another verify profile.

  - ``echo-profile``: the start-up profile's points (``PROFILE_TOKENS``) in 9 rounds, with a
    one-row slope window;
  - ``echo-dense``: every token count up to 24, then 28-128, one-row window: a CPU's verify
    cost is a staircase in rows (oneDNN's few-row GEMMs), and a one-row slope lands on its steps;
  - ``echo-stairs``: every count up to 8, then 10-128, and the slope averaged over at least 6
    rows (``ElasticFloor(slope_rows=...)``), the pricing the engine adopted on 2026-12-04;
  - ``echo-sparse``: the start-up points until 2026-12-04 (1, 4, 8, ..., 128) with a one-row
    window: ECHO's pricing before the staircase default.
- ``echo-pending``: the shipped ECHO whose EAGLE head queues up to ``LONG_PENDING`` committed
  rows per request before running them undrafted (``EagleDrafter.max_pending``; the default,
  ``MAX_PENDING``, is 256): a request that is never drafted then never runs its rows.
- ``echo-float32`` / ``echo-bfloat16``: the shipped ECHO with the EAGLE head run in that dtype
  (``ECHO_DRAFT_DTYPE``, drafting/eagle_drafter.py; ``echo`` runs the machine's default).
- ``plain-nopad`` / ``echo-nopad``: plain decoding / the shipped ECHO on a second copy of the
  model loaded with ``ECHO_LINEAR_PAD=off`` (few-row projections never padded:
  echo_server/model/linear.py), for the effect of padding on both.
- ``echo-noexplore``: the shipped ECHO whose cost feedback never explores untimed row counts
  (``CostFeedback.explores = False``; engine/cost_feedback.py).
- ``echo-window``: the shipped ECHO whose EAGLE head keeps only the last ``PROMPT_WINDOW``
  rows of a prompt it has not run yet (``EagleDrafter(prompt_window=...)``): a long prompt costs
  the head at most that many rows, and its context starts there.
- ``plain-gather`` / ``echo-gather``: plain decoding / the shipped ECHO on a copy of the model
  (same weights) whose attention gathers every request's context from the KV pool in every layer
  (``TorchAttention()`` without lane mirrors, as before 2026-12-05: model/kv_mirror.py);
  ``plain-mirror0`` / ``echo-mirror0``: the same with every group read from the lane mirrors
  (``min_context = 0``; the default mirrors from 1,024 tokens).
- ``echo-prevhead``: the shipped ECHO drafting with the previous shipped head and its own
  calibrated gate (``echo_server.assets.PREVIOUS_HEAD`` / ``PREVIOUS_GATE``, kept for one
  release), so the two heads compare in one run.
- ``POLICY@K`` (any arm above, or ``chain``, ``static``, ``eagle2``, ``global-topk``): that arm
  with verify budget K instead of the default 16, for a peer's best-budget sweep, e.g.
  ``--arms plain echo chain@8 chain@16 chain@32 eagle2@8 eagle2@16 eagle2@32``.

    .venv/bin/python packages/echo-server/scripts/bench_echo_variants.py --rounds 4 \\
        --concurrency 8 --workloads mtbench humaneval --prompts docs/bench/holdout.jsonl \\
        --arms plain echo echo-z0 echo-priced

Prints one line per (workload, arm): the median speedup over plain decoding over the rounds,
its 95% interval, the rounds, the same while every slot was busy (``busy``: the bench's
``steady_tokens_per_s``, bench/metrics.py), the mean accepted length, and of the median round
the steps, draft rows verified and milliseconds per phase per step; and whether every output
equalled plain decoding's. For ECHO arms it adds how their steps were decided over all rounds
(``EchoPolicy.step_modes``: the floor's pre-check, or the mode chooser's plain / shallow / full).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
from pathlib import Path

import torch

from echo_lab.bench.metrics import RunResult
from echo_lab.bench.suite import SuiteSpec, run_suite
from echo_lab.bench.workloads import load_workloads
from echo_lab.cli.bench import _factory
from echo_scheduler.cost import ProfileCost
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.interface import StepOutcome
from echo_scheduler.policies.echo import EchoPolicy
from echo_server.assets import PREVIOUS_GATE, PREVIOUS_HEAD
from echo_server.cli import build_parser
from echo_server.cli.options import load
from echo_server.drafting.eagle_drafter import EagleDrafter
from echo_server.engine import Engine
from echo_server.engine.profile import PROFILE_TOKENS, measure_profile_rounds
from echo_server.model.llama import default_mirror
from echo_server.model.torch_attention import TorchAttention

ARMS = (
    "plain",
    "echo",
    "echo-z0",
    "echo-priced",
    "echo-rows",
    "echo-profile",
    "echo-dense",
    "echo-stairs",
    "echo-sparse",
    "echo-float32",
    "echo-bfloat16",
    "plain-nopad",
    "echo-nopad",
    "echo-pending",
    "plain-gather",
    "echo-gather",
    "plain-mirror0",
    "echo-mirror0",
    "echo-window",
    "echo-noexplore",
    "echo-prevhead",
)
PROFILE_ARMS: dict[str, tuple[tuple[int, ...], int, float]] = {
    "echo-profile": (PROFILE_TOKENS, 9, 1.0),
    "echo-dense": ((*range(1, 25), 28, 32, 40, 48, 64, 96, 128), 7, 1.0),
    # the staircase's step width on the EPYC (bench_row_staircase.py) as the slope window
    "echo-stairs": ((*range(1, 9), 10, 12, 16, 24, 32, 48, 64, 96, 128), 7, 6.0),
    "echo-sparse": ((1, 4, 8, 16, 32, 64, 128), 9, 1.0),  # the start-up points until 2026-12-04
}
"""Arm -> (profile token counts, interleaved rounds, the floor's ``slope_rows``)."""
VARIANTS = (
    "echo-z0",
    "echo-priced",
    "echo-rows",
    "echo-pending",
    "echo-window",
    "echo-noexplore",
    *PROFILE_ARMS,
)
LOW_ROW_FLOOR = 0.25  # echo-rows
LONG_PENDING = 4096  # echo-pending
PROMPT_WINDOW = 256  # echo-window
PEERS = ("chain", "static", "eagle2", "global-topk")
DTYPE_ARMS = {"echo-float32": "float32", "echo-bfloat16": "bfloat16"}


_PROFILES: dict[str, ProfileCost] = {}  # per profile arm, measured once


def _variant(engine: Engine, arm: str) -> Engine:
    if arm in PROFILE_ARMS:
        tokens, rounds, slope_rows = PROFILE_ARMS[arm]
        if arm not in _PROFILES:
            seconds = measure_profile_rounds(engine.model, tokens, rounds=rounds)
            _PROFILES[arm] = ProfileCost(tuple(float(t) for t in tokens), tuple(seconds))
            ms = " ".join(f"{t}:{1000 * s:.1f}" for t, s in zip(tokens, seconds, strict=True))
            print(f"{arm} profile ms: {ms}")
        engine.elastic = ElasticFloor(_PROFILES[arm], slope_rows=slope_rows)
        return engine
    if arm in ("echo-pending", "echo-window"):
        drafter = engine.drafter
        if not isinstance(drafter, EagleDrafter):
            raise TypeError(f"{arm} needs the EAGLE drafter")
        if arm == "echo-pending":
            drafter.max_pending = LONG_PENDING
        else:
            drafter.prompt_window = PROMPT_WINDOW
        return engine
    if arm == "echo-noexplore":
        engine.cost_feedback.explores = False
        return engine
    if arm == "echo-rows":
        if engine.elastic is None:
            raise TypeError("echo-rows needs the engine's elastic floor")
        engine.elastic.row_floor = LOW_ROW_FLOOR
        return engine
    policy = engine.policy
    if not isinstance(policy, EchoPolicy) or policy.ledger is None:
        raise TypeError("the ledger variants need ECHO with its ledger")
    if arm == "echo-z0":
        policy.ledger.z = 0.0
        if policy.shallow_ledger is not None:
            policy.shallow_ledger.z = 0.0
    elif arm == "echo-priced":
        observe = policy.observe

        def untimed(outcome: StepOutcome) -> None:
            observe(StepOutcome(outcome.accepted_lengths, outcome.verified))

        policy.observe = untimed  # type: ignore[method-assign]
    return engine


def _arm(text: str) -> str:
    """An arm: one of the variants, or POLICY@K with a budget K >= 1 (module docstring)."""
    name, at, budget = text.partition("@")
    if name not in ARMS + PEERS or (not at and name in PEERS):
        raise argparse.ArgumentTypeError(f"unknown arm {text!r}: one of {ARMS}, or POLICY@K")
    if at and not (budget.isdigit() and int(budget) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r}: the budget after @ must be an integer >= 1")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--workloads", nargs="*", default=["mtbench", "humaneval"])
    p.add_argument("--prompts", type=Path, default=None)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--arms", nargs="+", type=_arm, default=list(ARMS[:4]), help=_arm.__doc__)
    a = p.parse_args()
    if "plain" not in a.arms:
        p.error("--arms must include plain (the speedups are over it)")
    torch.set_num_threads(1)
    argv = ["bench", "--threads", "1", "--max-tokens", str(a.max_tokens)]
    argv += ["--workloads", *a.workloads]
    if a.prompts is not None:
        argv += ["--prompts", str(a.prompts)]
    args = build_parser().parse_args(argv)
    workloads = load_workloads(args.workloads, a.num_prompts, args.prompts)
    loaded = load(args)
    make = _factory(loaded, args, workloads)
    make_nopad = None
    if any(arm.endswith("-nopad") for arm in a.arms):
        os.environ["ECHO_LINEAR_PAD"] = "off"
        try:
            make_nopad = _factory(load(args), args, workloads)
        finally:
            del os.environ["ECHO_LINEAR_PAD"]

    mirror0 = dataclasses.replace(
        default_mirror(loaded.model.config, loaded.model.dtype), min_context=0
    )
    backends = {"-gather": TorchAttention(), "-mirror0": TorchAttention(mirror=mirror0)}
    makers = {}
    for suffix, backend in backends.items():
        if any(arm.endswith(suffix) for arm in a.arms):
            model = copy.copy(loaded.model)  # same weights, its own attention backend
            model.attention = backend
            makers[suffix] = _factory(dataclasses.replace(loaded, model=model), args, workloads)

    if "echo-prevhead" in a.arms:
        previous = argparse.Namespace(
            **{**vars(args), "head": PREVIOUS_HEAD, "gate": PREVIOUS_GATE}
        )
        makers["-prevhead"] = _factory(loaded, previous, workloads)

    made: dict[str, list[Engine]] = {}

    def factory(label: str, concurrency: int) -> Engine:
        arm, _, budget = label.partition("@")
        before = os.environ.get("ECHO_DRAFT_DTYPE")
        os.environ["ECHO_DRAFT_DTYPE"] = DTYPE_ARMS.get(arm, before or "auto")
        default_budget, args.budget = args.budget, int(budget) if budget else args.budget
        try:
            maker = make_nopad if make_nopad is not None and arm.endswith("-nopad") else make
            for suffix, other in makers.items():
                if arm.endswith(suffix):
                    maker = other
            engine: Engine = maker(
                arm.split("-")[0] if arm.startswith(("echo", "plain")) else arm, concurrency
            )
        finally:
            os.environ["ECHO_DRAFT_DTYPE"] = before or "auto"
            args.budget = default_budget
        made.setdefault(label, []).append(engine)
        return _variant(engine, arm) if arm in VARIANTS else engine

    spec = SuiteSpec(tuple(a.arms), (a.concurrency,), a.max_tokens, rounds=a.rounds)
    modes: dict[tuple[str, str], str] = {}

    def settled(run: RunResult) -> None:  # a cell's rounds are done: count its engines' steps
        modes[(run.workload, run.policy)] = _modes(made.pop(run.policy, []))

    for r in run_suite(factory, workloads, spec, progress=False, on_run=settled).runs:
        ci = r.speedup_ci95 or (float("nan"), float("nan"))
        rounds = ", ".join(f"{x:.3f}" for x in r.speedup_rounds)
        busy = r.steady_speedup_ci95 or (float("nan"), float("nan"))
        phases = " ".join(f"{k} {v:.1f}" for k, v in r.phase_ms_per_step.items())
        steady = float("nan") if r.steady_speedup is None else r.steady_speedup
        print(
            f"{r.workload} {r.policy}: {r.speedup:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] "
            f"rounds {rounds}; busy {steady:.3f} [{busy[0]:.3f}, {busy[1]:.3f}]; "
            f"MAT {r.mean_accepted_length:.3f}; steps {r.steps}; rows/step "
            f"{r.verified_per_step:.1f}; ms/step {phases}; "
            f"outputs match {r.outputs_match}{modes.get((r.workload, r.policy), '')}"
        )


def _modes(engines: list[Engine]) -> str:
    """``; modes floor F plain P shallow S full U`` summed over an ECHO arm's engines ('' for
    other arms)."""
    counts: dict[str, int] = {}
    for engine in engines:
        if isinstance(engine.policy, EchoPolicy):
            for mode, n in engine.policy.step_modes.items():
                counts[mode] = counts.get(mode, 0) + n
    return "; modes " + " ".join(f"{k} {v}" for k, v in counts.items()) if counts else ""


if __name__ == "__main__":
    main()
