"""Engine metrics: per-phase step timings, acceptance statistics, warm-up records.

- ``draft_yield = accepted draft tokens / verified draft tokens``;
- ``mean_accepted_length = (accepted + bonus) / (request-steps)``: tokens emitted per request per
  verify pass (1.0 = plain decoding);
- ``verified_per_step``: draft tokens verified per engine step (what the budget K caps).

With a :class:`~echo_gating.records.RecordWriter` attached, every verified node is logged with
its signals and whether the target accepted it, in echo-gating's warm-up format, so calibration
and the simulator can use real runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult
from echo_core.stats import StatsAccumulator, StepStats
from echo_core.tree import TreeBatch
from echo_gating.records import RecordWriter

PHASES = ("draft", "verify", "accept", "commit", "emit")


class StepTimer:
    """Wall time of consecutive phases: ``mark(name)`` closes the phase that ran since the last
    mark."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


def accepted_mask(tree: TreeBatch, result: AcceptResult) -> Tensor:
    """[N] bool: node lies on its request's accepted path."""
    mask = torch.zeros(tree.num_nodes, dtype=torch.bool, device=tree.device)
    width = result.accepted_nodes.shape[1]
    valid = torch.arange(width, device=tree.device)[None, :] < result.num_accepted[:, None]
    glob = tree.cu_nodes[:-1, None] + result.accepted_nodes.clamp(min=0)
    mask[glob[valid]] = True
    return mask


@dataclass(slots=True)
class EngineMetrics:
    """Running totals over the engine's life (reset with :meth:`reset`)."""

    steps: int = 0
    emitted_tokens: int = 0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    acceptance: StatsAccumulator = field(default_factory=StatsAccumulator)
    records: RecordWriter | None = None
    request_ids: dict[str, int] = field(default_factory=dict)  # running requests only
    _next_id: int = 0

    def record_step(
        self,
        tree: TreeBatch,
        result: AcceptResult,
        timer: StepTimer,
        emitted: int,
        request_ids: list[str],
        request_steps: list[int],
    ) -> None:
        self.steps += 1
        self.emitted_tokens += emitted
        for phase, sec in timer.seconds.items():
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + sec
        self.acceptance.add(StepStats.from_result(tree, result))
        if self.records is not None and tree.num_nodes:
            ids = [self._record_id(r) for r in request_ids]
            self.records.append_pool(
                tree,
                accepted_mask(tree, result),
                torch.tensor(ids, dtype=torch.int64),
                torch.tensor(request_steps, dtype=torch.int64),
            )

    def _record_id(self, request_id: str) -> int:
        """A stable integer id per request for warm-up records (never reused)."""
        if request_id not in self.request_ids:
            self.request_ids[request_id] = self._next_id
            self._next_id += 1
        return self.request_ids[request_id]

    def forget(self, request_id: str) -> None:
        """Drop a finished request's record id (keeps the map bounded by running requests)."""
        self.request_ids.pop(request_id, None)

    @property
    def verified_per_step(self) -> float:
        return self.acceptance.verified / self.steps if self.steps else 0.0

    def summary(self) -> dict[str, float]:
        """Flat numbers for logs and stats endpoints."""
        out = {
            "steps": float(self.steps),
            "emitted_tokens": float(self.emitted_tokens),
            "draft_yield": self.acceptance.draft_yield,
            "mean_accepted_length": self.acceptance.mean_accepted_length,
            "verified_per_step": self.verified_per_step,
        }
        out.update({f"{k}_s": v for k, v in self.phase_seconds.items()})
        return out

    def reset(self) -> None:
        self.steps = 0
        self.emitted_tokens = 0
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        self.acceptance = StatsAccumulator()
