"""What one :meth:`Engine.step` returns: the only way anything outside the engine learns what a
step did (gRPC's stats and calibration records, the bench, the metrics).

A :class:`StepReport` holds the step's events (what to stream), its acceptance counts
(:class:`~echo_core.stats.AcceptanceTotals` over the decode batch), the tokens emitted (prefill
first tokens included), wall time per phase and one :class:`VerifiedStep` per decode pass: the
budget K, the candidate pool, the policy's selection, the verified SuperTree and which of its
nodes the target accepted. ``StepReport.append_records`` logs every verified
node in echo-gating's warm-up format: the input of gate calibration and of the drift monitor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult
from echo_core.stats import AcceptanceTotals, StepStats
from echo_core.tree import TreeBatch
from echo_gating.records import RecordWriter
from echo_scheduler.driver import DrivenStep
from echo_scheduler.interface import StepBatch
from echo_server.engine.pass_timing import EventPair
from echo_server.engine.request import RequestState, StepEvent

if TYPE_CHECKING:
    from echo_server.engine.cost_feedback import CostSnapshot

PHASES = ("prefill", "draft", "verify", "accept", "commit", "emit")
"""Wall-time phases of a step, in order (``draft`` includes the policy's scheduling time)."""


class StepTimer:
    """Wall time of consecutive phases: ``mark(name)`` closes the phase that ran since the last
    mark (or since construction)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


def accepted_mask(tree: TreeBatch, result: AcceptResult) -> Tensor:
    """[N] bool: the node lies on its request's accepted path."""
    mask = torch.zeros(tree.num_nodes, dtype=torch.bool, device=tree.device)
    width = result.accepted_nodes.shape[1]
    valid = torch.arange(width, device=tree.device)[None, :] < result.num_accepted[:, None]
    glob = tree.cu_nodes[:-1, None] + result.accepted_nodes.clamp(min=0)
    mask[glob[valid]] = True
    return mask


@dataclass(frozen=True, slots=True)
class VerifiedStep:
    """The speculative half of a decode step, as verified and accepted."""

    request_ids: tuple[str, ...]  # the decode batch, in batch order
    serials: Tensor  # [B] int64, each request's engine-wide serial number (never reused)
    request_steps: Tensor  # [B] int64, each request's decode steps including this one
    root_positions: Tensor  # [B] int64, position of each request's root (its last committed)
    budget: int  # K this step ran under
    max_nodes: Tensor  # [B] int64, per-request cap on draft nodes
    driven: DrivenStep  # pool, selection, verified tree, depths, scheduling time
    on_path: Tensor  # [tree.num_nodes] bool, node on its request's accepted path
    stats: StepStats
    forward_s: float | None = None  # the target model's share of the verify phase (CPU only)
    forward_events: EventPair | None = None  # CUDA: events around it (engine/pass_timing.py)

    @classmethod
    def of(
        cls,
        batch: Sequence[RequestState],
        step: StepBatch,
        driven: DrivenStep,
        result: AcceptResult,
        root_positions: Tensor,
        forward_s: float | None = None,
        forward_events: EventPair | None = None,
    ) -> VerifiedStep:
        """The record of a committed pass over ``batch`` (request counters already advanced)."""
        tree = driven.tree
        return cls(
            request_ids=tuple(s.request_id for s in batch),
            serials=torch.tensor([s.serial for s in batch], dtype=torch.int64, device="cpu"),
            request_steps=torch.tensor([s.steps for s in batch], dtype=torch.int64, device="cpu"),
            root_positions=root_positions,
            budget=step.budget,
            max_nodes=step.max_nodes,
            driven=driven,
            on_path=accepted_mask(tree, result),
            stats=StepStats.from_result(tree, result),
            forward_s=forward_s,
            forward_events=forward_events,
        )

    @property
    def tree(self) -> TreeBatch:
        """The verified SuperTree."""
        return self.driven.tree

    @property
    def pool(self) -> TreeBatch:
        """Every candidate drafted this step."""
        return self.driven.pool

    @property
    def keep(self) -> Tensor:
        """[pool.num_nodes] bool, the policy's selection inside :attr:`pool`."""
        return self.driven.keep

    @property
    def schedule_s(self) -> float:
        """Wall time inside the policy's methods (counted inside the ``draft`` phase)."""
        return self.driven.schedule_s

    def append_records(self, writer: RecordWriter) -> None:
        """Log every verified node (signals, acceptance) to ``writer``; nothing if none."""
        if self.tree.num_nodes:
            writer.append_pool(self.tree, self.on_path, self.serials, self.request_steps)


@dataclass(frozen=True, slots=True)
class StepReport:
    """Everything one engine step did (module docstring)."""

    events: list[StepEvent]
    admitted: int = 0  # requests prefilled this step
    emitted: int = 0  # tokens emitted, prefill first tokens included
    acceptance: AcceptanceTotals = field(default_factory=AcceptanceTotals)
    phase_s: dict[str, float] = field(default_factory=dict)
    passes: tuple[VerifiedStep, ...] = ()  # decode passes: one, none, or per-request retries
    cost: CostSnapshot | None = None  # the verify-cost model after this step (cost_feedback.py)

    @property
    def batch(self) -> int:
        """Requests in the decode pass (its request-steps)."""
        return self.acceptance.request_steps

    @property
    def seconds(self) -> float:
        return sum(self.phase_s.values())

    def append_records(self, writer: RecordWriter) -> None:
        """Log every node verified this step to ``writer`` (see :class:`VerifiedStep`)."""
        for verified in self.passes:
            verified.append_records(writer)

    def merge(self, other: StepReport) -> StepReport:
        """Two parts of one step (prefill then decode, or per-request retries) as one report."""
        phases = dict(self.phase_s)
        for name, sec in other.phase_s.items():
            phases[name] = phases.get(name, 0.0) + sec
        return StepReport(
            events=self.events + other.events,
            admitted=self.admitted + other.admitted,
            emitted=self.emitted + other.emitted,
            acceptance=self.acceptance + other.acceptance,
            phase_s=phases,
            passes=self.passes + other.passes,
            cost=other.cost or self.cost,
        )
