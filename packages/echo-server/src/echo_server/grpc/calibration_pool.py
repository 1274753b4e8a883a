"""Calibration sharing: the controller pools nodes' warm-up records and recalibrates the gates.

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

from echo_gating.calibrate import CalibrationConfig, calibrate
from echo_gating.policy import GatePolicy
from echo_gating.records import RECORD_COLUMNS, RecordSet

ModelPair = tuple[str, str]  # (target, drafter)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    max_records: int = 200_000
    min_records: int = 2_000
    min_interval_s: float = 30.0
    calibration: CalibrationConfig = dataclasses.field(default_factory=CalibrationConfig)

    def __post_init__(self) -> None:
        if self.max_records < 1 or not 1 <= self.min_records <= self.max_records:
            raise ValueError(
                f"need 1 <= min_records <= max_records, got {self.min_records}, {self.max_records}"
            )
        if self.min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {self.min_interval_s}")


@dataclass(slots=True)
class _Pool:
    parts: deque[RecordSet] = dataclasses.field(default_factory=deque)
    size: int = 0
    policy: GatePolicy | None = None
    calibrated_at: float | None = None
    busy: bool = False  # a recalibration is running


class CalibrationPool:
    """Warm-up records and the current shared GatePolicy of every model pair."""

    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self._pools: dict[ModelPair, _Pool] = {}
        self._next_request = 0

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
        """CPU work (run it off the event loop): echo-gating's calibration on the pool."""
        return calibrate(records, self.config.calibration)
