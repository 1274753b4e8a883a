"""Calibration sharing: the controller pools nodes' warm-up records and recalibrates the gates.

The only module of echo-controller that needs echo-gating (and so torch): it is imported by
:func:`echo_controller.calibration.calibration_pool` when calibration sharing is enabled, never
by the rest of the controller.

Records are pooled per model pair (target, drafter): a GatePolicy is only valid for the pair it
was calibrated on. Each pool keeps the newest ``max_records`` records. Request ids are renumbered
on the way in (every node counts its own from 0) so that gate samples, grouped per (request,
step, depth), never merge two nodes' requests. When a node reports drift, the pool recalibrates
with echo-gating once it holds ``min_records`` records and ``min_interval_s`` has passed since
its last calibration; the new policy's version travels in the next leases of that pair.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass

import torch

from echo_controller.calibration import ModelPair, PoolConfig
from echo_controller.convert import WARMUP_FORMAT
from echo_controller.errors import CalibrationFailedError, FieldError
from echo_core.errors import EchoError
from echo_gating.calibrate import CalibrationConfig, calibrate
from echo_gating.policy import GatePolicy
from echo_gating.record_file import decode_records
from echo_gating.records import RECORD_COLUMNS, RecordSet
from echo_proto.budget.v1 import budget_pb2 as bpb


@dataclass(slots=True)
class _Pool:
    parts: deque[RecordSet] = dataclasses.field(default_factory=deque)
    size: int = 0
    policy: GatePolicy | None = None
    calibrated_at: float | None = None
    busy: bool = False  # a recalibration is running


class CalibrationPool:
    """Warm-up records and the current shared GatePolicy of every model pair."""

    def __init__(
        self, config: PoolConfig | None = None, gating: CalibrationConfig | None = None
    ) -> None:
        self.config = config or PoolConfig()
        self.gating = gating or CalibrationConfig()
        self._pools: dict[ModelPair, _Pool] = {}
        self._next_request = 0

    @staticmethod
    def decode(msg: bpb.ReportRequest) -> RecordSet | None:
        """The warm-up records a report carries (None: it carries none); FieldError if bad."""
        if not msg.warmup_records and not msg.warmup_format:
            return None
        if msg.warmup_format != WARMUP_FORMAT:
            raise FieldError(
                "warmup_format", f"expected {WARMUP_FORMAT!r}, got {msg.warmup_format!r}"
            )
        try:
            return decode_records(msg.warmup_records, source="warmup_records")
        except EchoError as exc:
            raise FieldError("warmup_records", str(exc)) from exc

    def add(self, pair: ModelPair, records: RecordSet) -> None:
        """Pool a node's records (renumbered, meta set to the pair); drop the oldest overflow."""
        if len(records) == 0:
            return
        _, ids = torch.unique(records.request_id, return_inverse=True)
        renumbered = ids.to(torch.int64) + self._next_request
        self._next_request = int(renumbered.max()) + 1
        cols = {name: getattr(records, name) for name in RECORD_COLUMNS}
        cols["request_id"] = renumbered
        meta = {"target": pair[0], "drafter": pair[1]}
        part = RecordSet(**cols, extra={}, meta=meta)
        pool = self._pools.setdefault(pair, _Pool())
        pool.parts.append(part)
        pool.size += len(part)
        while pool.size - len(pool.parts[0]) >= self.config.max_records:
            pool.size -= len(pool.parts.popleft())

    def records(self, pair: ModelPair) -> int:
        pool = self._pools.get(pair)
        return pool.size if pool is not None else 0

    def policy(self, pair: ModelPair) -> GatePolicy | None:
        pool = self._pools.get(pair)
        return pool.policy if pool is not None else None

    def policies(self) -> list[GatePolicy]:
        return [p.policy for p in self._pools.values() if p.policy is not None]

    def claim(self, pair: ModelPair, now: float) -> RecordSet | None:
        """The pooled records to recalibrate from, if a recalibration may start now.

        Marks the pair busy until :meth:`install` (or :meth:`release` after a failure)."""
        pool = self._pools.get(pair)
        cfg = self.config
        if pool is None or pool.busy or pool.size < cfg.min_records:
            return None
        if pool.calibrated_at is not None and now - pool.calibrated_at < cfg.min_interval_s:
            return None
        pool.busy = True
        return RecordSet.concat(list(pool.parts))

    def install(self, pair: ModelPair, policy: GatePolicy, now: float) -> None:
        pool = self._pools.setdefault(pair, _Pool())
        pool.policy, pool.calibrated_at, pool.busy = policy, now, False

    def release(self, pair: ModelPair, now: float) -> None:
        """A claimed recalibration failed: back off for ``min_interval_s``."""
        pool = self._pools.setdefault(pair, _Pool())
        pool.calibrated_at, pool.busy = now, False

    def recalibrate(self, records: RecordSet) -> GatePolicy:
        """CPU work (run it off the event loop): echo-gating's calibration on the pool.

        Raises :class:`CalibrationFailedError` when echo-gating refuses the records."""
        try:
            return calibrate(records, self.gating)
        except EchoError as exc:
            raise CalibrationFailedError(str(exc)) from exc
