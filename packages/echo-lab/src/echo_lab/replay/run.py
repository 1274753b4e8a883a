"""Deterministic replay: every arm on the same recorded steps, priced by every cost model.

Per trace (one workload's rows, :mod:`echo_lab.sim.rows`), a seeded share of the rows (of
the requests, when the rows know theirs) is the warm-up: the gates of
:mod:`echo_lab.replay.gates` are calibrated on it. From the rest, for each batch size B,
``steps`` batches of B rows are composed (seeded; as request streams when the rows know their
requests, so per-request learning sees each slot's requests in order, else drawn with
replacement) and
every arm (:mod:`echo_lab.replay.arms`) is driven through them with the engine's exact
call sequence (:func:`~echo_scheduler.device.driver.drive`, greedy acceptance against the
recorded continuation, ``observe`` after each step). Arms without the cost floor behave the
same under every cost model, so they are driven once per (trace, B) and priced by each model;
arms with the floor are driven once per cost model, the floor fed the modelled phase times
(:class:`~echo_scheduler.elastic.ElasticFloor`, as the engine feeds it measured ones).

A step's seconds are the cost model's (:mod:`echo_lab.replay.costs`); an arm's rate is
``sum_i (B + a_i) / sum_i t_i``. Every arm is compared with ``echo`` on the same steps by a
paired bootstrap (:mod:`echo_lab.replay.paired`) and with the hindsight oracle by eta
(:mod:`echo_lab.replay.hindsight`). The ``echo_utility`` arm's gate is chosen per (cost
model, B) on ``tune_steps`` batches composed from the warm-up rows
(:mod:`echo_lab.replay.utility`). No wall clock enters any number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from echo_gating.policy import GatePolicy
from echo_lab.replay.arms import GRID_FAMILIES, UTILITY_ARM, Arm
from echo_lab.replay.costs import StepCost
from echo_lab.replay.fairness import request_tails
from echo_lab.replay.gates import calibrate_variants, warmup_records
from echo_lab.replay.hindsight import OracleRun, oracle_run
from echo_lab.replay.paired import paired, resample_index
from echo_lab.replay.utility import GateChoice, candidate_gates, choose_gate
from echo_lab.sim.rows import (
    TraceRow,
    compose,
    compose_streams,
    has_requests,
    stack,
    streams,
)
from echo_lab.sim.trace import RecordedStep
from echo_scheduler.device.driver import drive
from echo_scheduler.driver import Around, DraftSource, DrivenStep, PolicyClock
from echo_scheduler.elastic import ElasticFloor, step_batch
from echo_scheduler.errors import TraceError
from echo_scheduler.interface import Policy, StepOutcome
from echo_scheduler.outcome import accepted_lengths, accepted_mask
from echo_scheduler.policies import make_policy
from echo_scheduler.simulator import DeviceSource, SimSource

WARMUP_CHUNK = 64
MIN_WARMUP_ROWS = 100
"""Fewer rows cannot calibrate the gates (echo-gating wants 20 samples per depth and class)."""


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    steps: int = 20
    seed: int = 0
    calibration_share: float = 0.3
    resamples: int = 2000
    tune_steps: int = 6  # warm-up batches per cell on which echo_utility's gate is chosen

    def __post_init__(self) -> None:
        if min(self.steps, self.resamples, self.tune_steps) < 1:
            raise TraceError(
                f"steps, resamples and tune_steps must be >= 1, got {self.steps}, "
                f"{self.resamples}, {self.tune_steps}"
            )


@dataclass(frozen=True, slots=True)
class ArmSteps:
    """Per-step counts of one arm on one cell's steps, [S] int64 each."""

    accepted: Tensor
    verified: Tensor
    calls: Tensor
    expansions: Tensor
    own_reach: Tensor  # accepted nodes reachable in the arm's own pool (capped per request)
    request_accepted: Tensor | None = None  # [S, B] accepted drafts per request and step
    request_verified: Tensor | None = None  # [S, B] verified draft rows per request and step

    def tokens(self, batch: int) -> int:
        """``sum_i (B + a_i)``: emitted tokens over the steps (one bonus per request each)."""
        return batch * int(self.accepted.numel()) + int(self.accepted.sum())

    def rate(self, seconds: Tensor, batch: int) -> float:
        """The run rate ``sum_i (B + a_i) / sum_i t_i`` (tokens/s) for per-step ``seconds``."""
        total = float(seconds.sum())
        return self.tokens(batch) / total if total > 0 else 0.0

    def seconds(self, cost: StepCost, batch: int) -> Tensor:
        return torch.tensor(
            [
                cost.draft_s(batch, c, e) + cost.verify_s(batch, batch + v)
                for c, e, v in zip(
                    self.calls.tolist(),
                    self.expansions.tolist(),
                    self.verified.tolist(),
                    strict=True,
                )
            ],
            dtype=torch.float64,
        )


def split_warmup(
    rows: Sequence[TraceRow], share: float, seed: int
) -> tuple[list[TraceRow], list[TraceRow]]:
    """(warm-up rows, evaluation rows): a seeded random ``share`` of the rows and the rest; when
    the rows know their requests, the rows of a seeded ``share`` of the requests and the rest
    (no request is in both)."""
    if not 0.0 < share < 1.0:
        raise TraceError(f"calibration share must lie in (0, 1), got {share}")
    g = torch.Generator().manual_seed(seed)
    if has_requests(rows):
        lanes = streams(rows)
        pick = torch.randperm(len(lanes), generator=g).tolist()[: round(len(lanes) * share)]
        names = {lanes[i][0].request for i in pick}
        warm = [r for r in rows if r.request in names]
        rest = [r for r in rows if r.request not in names]
        if not rest:
            raise TraceError(
                f"a share of {share} takes all {len(lanes)} requests for the warm-up; "
                "none is left to replay"
            )
        if len(warm) < MIN_WARMUP_ROWS:
            raise TraceError(
                f"{len(lanes)} requests leave {len(warm)} warm-up rows; calibrating the gates "
                f"needs at least {MIN_WARMUP_ROWS} (record more requests)"
            )
        return warm, rest
    order = torch.randperm(len(rows), generator=g).tolist()
    n = int(len(rows) * share)
    if n < MIN_WARMUP_ROWS or len(rows) - n < 1:
        raise TraceError(
            f"{len(rows)} rows leave {n} warm-up rows; calibrating the gates needs at least "
            f"{MIN_WARMUP_ROWS} (record more steps)"
        )
    return [rows[i] for i in order[:n]], [rows[i] for i in order[n:]]


def calibrate_rows(rows: Sequence[TraceRow], max_depth: int) -> dict[str, GatePolicy]:
    """The gate variants of :mod:`~echo_lab.replay.gates` from warm-up rows (stacked in
    chunks of ``WARMUP_CHUNK``)."""
    steps = [stack(rows[i : i + WARMUP_CHUNK]) for i in range(0, len(rows), WARMUP_CHUNK)]
    return calibrate_variants(warmup_records(steps), max_depth)


@dataclass(frozen=True, slots=True)
class ReplayedStep:
    """One recorded step driven through a policy (:func:`replay_step`)."""

    run: DrivenStep
    lengths: Tensor  # [B] accepted draft tokens per request
    verified: Tensor  # [B] verified draft rows per request
    host_s: float  # wall seconds inside the policy's and the floor's calls (no replay figure)
    host_cpu_s: float  # process CPU seconds of the same calls


def replay_step(
    policy: Policy,
    st: RecordedStep,
    budget: int,
    floor: ElasticFloor | None,
    cost: StepCost | None,
    serials: dict[str, int],
    device: torch.device | None = None,
    around: Around | None = None,
) -> ReplayedStep:
    """The engine's call sequence for one step: the floor's ``step_batch``, ``drive`` on the
    recording, greedy acceptance, ``observe``, and the floor fed the modelled phase times.
    ``serials`` maps the composed step's request names to the engine's serials (filled here).

    ``device``: the policy works on pools there (:class:`~echo_scheduler.simulator.DeviceSource`;
    None: the CPU). ``around``: a context every policy call runs inside (``drive``'s), here
    also ``observe``. The host time is that of the floor's and the policy's calls; greedy
    acceptance (the verify's own work) is left out."""
    b = st.batch_size
    ids = None
    if st.requests is not None:
        names = [serials.setdefault(r, len(serials)) for r in st.requests]
        ids = torch.tensor(names, dtype=torch.int64)
    clock = PolicyClock()  # the floor's and observe's host time (the driver times the rest)
    with clock.timed(None):
        batch = step_batch(floor, budget, st.max_nodes, ids)
    source: DraftSource = SimSource(st)
    if device is not None and device.type != "cpu":
        batch = dataclasses.replace(batch, max_nodes=batch.max_nodes.to(device))
        source = DeviceSource(st, device)
    run = drive(policy, source, batch, strict=True, around=around)
    pool, keep = run.pool.to("cpu"), run.keep.to("cpu")
    lengths = accepted_lengths(pool, keep, st.target)
    verified = torch.bincount(pool.request_index()[keep], minlength=b)
    dev = batch.max_nodes.device
    outcome = StepOutcome(accepted_lengths=lengths.to(dev), verified=verified.to(dev))
    with clock.timed(around):
        policy.observe(outcome)
    if floor is not None and cost is not None:
        with clock.timed(None):
            acc, ver = int(lengths.sum()), int(verified.sum())
            draft = cost.draft_s(b, run.depths, run.expansions)
            verify = cost.verify_s(b, b + ver)
            floor.observe(b, ver, b + acc, verify, draft, draft, run.depths, run.expansions)
    wall, cpu = clock.wall + run.schedule_s, clock.cpu + run.schedule_cpu_s
    return ReplayedStep(run, lengths, verified, wall, cpu)


def drive_arm(
    arm: Arm,
    steps: Sequence[RecordedStep],
    gates: Mapping[str, GatePolicy],
    cost: StepCost | None = None,
) -> ArmSteps:
    """Drive ``arm`` through ``steps`` (with the floor fed by ``cost`` when the arm has one)."""
    gate = gates[arm.gate] if arm.gate is not None else None
    policy = make_policy(arm.policy, arm.config, gate=gate)
    b = steps[0].batch_size
    floor = ElasticFloor(cost.verify_model(b)) if arm.floor and cost is not None else None
    budget = arm.budget(b)
    serials: dict[str, int] = {}  # a composed step's request names as the engine's serials
    out: list[list[int]] = []
    per_acc: list[Tensor] = []
    per_ver: list[Tensor] = []
    for st in steps:
        step = replay_step(policy, st, budget, floor, cost, serials)
        run, lengths, verified = step.run, step.lengths, step.verified
        req = run.pool.request_index()
        own = torch.bincount(req[accepted_mask(run.pool, st.target)], minlength=b)
        acc, ver = int(lengths.sum()), int(verified.sum())
        reach = int(torch.minimum(own, st.max_nodes).sum())
        out.append([acc, ver, run.depths, run.expansions, reach])
        per_acc.append(lengths.to(torch.int64))
        per_ver.append(verified)
    cols = torch.tensor(out, dtype=torch.int64).reshape(-1, 5).T
    c_acc, c_ver, c_calls, c_exp, c_reach = cols.unbind(0)
    return ArmSteps(
        c_acc, c_ver, c_calls, c_exp, c_reach, torch.stack(per_acc), torch.stack(per_ver)
    )


def _row(
    arm: Arm,
    series: ArmSteps,
    seconds: Tensor,
    batch: int,
    oracle: OracleRun,
    ref_reach: int,
) -> dict[str, Any]:
    s = max(int(series.accepted.numel()), 1)
    acc, ver = int(series.accepted.sum()), int(series.verified.sum())
    tokens = series.tokens(batch)
    total = float(seconds.sum())
    rate = series.rate(seconds, batch)
    best_own = int(torch.minimum(series.verified, series.own_reach).sum())
    return {
        "arm": arm.name,
        "family": arm.family,
        "per_request": arm.per_request,
        "tokens_per_s": rate,
        "mean_accepted_length": tokens / (batch * s),
        "accepted_per_step": acc / s,
        "verified_per_step": ver / s,
        "calls_per_step": float(series.calls.sum()) / s,
        "eta": rate / oracle.tokens_per_s if oracle.tokens_per_s > 0 else 0.0,
        "token_share": tokens / oracle.tokens if oracle.tokens > 0 else 0.0,
        "time_share": oracle.seconds / total if total > 0 else 0.0,
        "coverage": int(series.own_reach.sum()) / ref_reach if ref_reach else 1.0,
        "selection": acc / best_own if best_own else 1.0,
        "row_yield": acc / ver if ver else 0.0,
    }


def utility_gate(
    arm: Arm,
    tuning: Sequence[RecordedStep],
    gates: Mapping[str, GatePolicy],
    cost: StepCost,
) -> GateChoice:
    """``arm``'s gate for one cost model, chosen on the tuning steps (replay.utility)."""
    if not tuning:
        raise TraceError(f"arm {arm.name} needs tuning steps composed from the warm-up rows")
    b = tuning[0].batch_size

    def rate(gate: GatePolicy) -> float:
        series = drive_arm(arm, tuning, {**gates, arm.name: gate}, cost)
        return series.rate(series.seconds(cost, b), b)

    return choose_gate(candidate_gates(gates["echo_nogate"], tuning), rate)


def replay_cell(
    trace: str,
    steps: Sequence[RecordedStep],
    gates: Mapping[str, GatePolicy],
    arms: Sequence[Arm],
    costs: Sequence[StepCost],
    spec: ReplaySpec,
    tuning: Sequence[RecordedStep] = (),
) -> list[dict[str, Any]]:
    """Every arm under every cost model on one (trace, B) cell; one JSON row per (cost, arm).

    ``tuning``: warm-up steps at the same B, for the ``echo_utility`` arm's gate choice.
    """
    b = steps[0].batch_size
    fixed = {a.name: drive_arm(a, steps, gates) for a in arms if not a.floor}
    reaches = [torch.minimum(st.reachable(0), st.max_nodes) for st in steps]
    ref_reach = int(sum(int(r.sum()) for r in reaches))
    index = resample_index(len(steps), spec.resamples, spec.seed + b)
    rows: list[dict[str, Any]] = []
    for cost in costs:
        oracle = oracle_run(reaches, cost)
        cell = []
        chosen = {
            a.name: utility_gate(a, tuning, gates, cost) for a in arms if a.gate == UTILITY_ARM
        }
        at_cost = {**gates, **{name: c.gate for name, c in chosen.items()}}
        series = {
            a.name: (fixed[a.name] if not a.floor else drive_arm(a, steps, at_cost, cost))
            for a in arms
        }
        seconds = {n: s.seconds(cost, b) for n, s in series.items()}
        tokens = {n: (b + s.accepted).to(torch.float64) for n, s in series.items()}
        for a in arms:
            row = _row(a, series[a.name], seconds[a.name], b, oracle, ref_reach)
            row.update({"trace": trace, "cost_model": cost.name, "batch": b})
            row.update(_tails(steps, series[a.name], seconds[a.name], seconds.get("plain")))
            if a.name in chosen:
                row.update(
                    {"gate_choice": chosen[a.name].label, "tuning_gain": chosen[a.name].gain}
                )
            if "echo" in series:
                p = paired(tokens[a.name], seconds[a.name], tokens["echo"], seconds["echo"], index)
                row.update(
                    {
                        "diff_vs_echo": p.diff,
                        "ci95": list(p.diff_ci95),
                        "ratio_vs_echo": p.ratio,
                        "ratio_ci95": list(p.ratio_ci95),
                    }
                )
            cell.append(row)
        plain = next((r["tokens_per_s"] for r in cell if r["arm"] == "plain"), 0.0)
        for r in cell:
            r["vs_plain"] = r["tokens_per_s"] / plain if plain else 0.0
        rows += cell
        rows += best_of_families(cell)
        rows.append(
            {
                "trace": trace,
                "cost_model": cost.name,
                "batch": b,
                "arm": "oracle",
                "family": "oracle",
                "tokens_per_s": oracle.tokens_per_s,
                "accepted_per_step": float(oracle.accepted.sum()) / len(steps),
                "calls_per_step": float(oracle.calls.sum()) / len(steps),
                "eta": 1.0,
                "vs_plain": oracle.tokens_per_s / plain if plain else 0.0,
            }
        )
    return rows


def _tails(
    steps: Sequence[RecordedStep], series: ArmSteps, seconds: Tensor, plain: Tensor | None
) -> dict[str, float | int | None]:
    """Per-request tails (replay.fairness) when the steps name their requests, else nothing."""
    acc, ver = series.request_accepted, series.request_verified
    if plain is None or acc is None or ver is None:
        return {}
    tails = request_tails(steps, acc, ver, seconds, plain)
    return {} if tails is None else tails.as_row()


def best_of_families(cell: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per grid family, its best point in the cell as an extra row ``<family>*`` (hindsight)."""
    out = []
    for fam in GRID_FAMILIES:
        members = [r for r in cell if r["family"] == fam]
        if members:
            top = max(members, key=lambda r: r["tokens_per_s"])
            out.append({**top, "arm": f"{fam}*", "best_of": top["arm"]})
    return out


def compose_steps(
    rows: Sequence[TraceRow], batch: int, steps: int, seed: int
) -> list[RecordedStep]:
    """``steps`` batches of ``batch`` rows: request streams when the rows know their requests,
    else drawn with replacement (:mod:`echo_lab.sim.rows`)."""
    g = torch.Generator().manual_seed(seed * 100_003 + batch)
    if has_requests(rows):
        return compose_streams(rows, batch, steps, g)
    return [compose(rows, batch, g) for _ in range(steps)]
