"""Node side of gating: what the engine's warm-up records say about the live gates.

A consumer of the engine's :class:`~echo_server.engine.report.StepReport`: on the engine thread
:meth:`GateObserver.consume` keeps each step's verified draft nodes (depth, confidence,
accepted) as warm-up records; on the node's event loop :meth:`GateObserver.flush` (every
``observe_interval_s``, :class:`~echo_server.node.node.Node`) observes those taken since the last
flush. Whatever the transport (gRPC, HTTP, the embedded engine thread), the observer keeps

- echo-gating's :class:`~echo_gating.drift.DriftMonitor` for the gate policy in use (predicted vs
  realised acceptance and the truncation rate per checkpoint; drift advice for the controller);
- the newest ``history`` records, for the marginal-utility curve (:mod:`.utility`);
- the newest ``ship_limit`` records not yet sent, for the next report (calibration sharing).

A new gate policy restarts the monitor: its predictions are those of the new calibration.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping

from echo_gating.drift import DriftConfig, DriftMonitor, DriftReport
from echo_gating.policy import GatePolicy
from echo_gating.records import RecordSet, RecordWriter, gate_samples
from echo_server.engine.report import StepReport
from echo_server.node.utility import marginal_utility, rank_acceptance


class GateObserver:
    def __init__(
        self,
        gate: GatePolicy,
        *,
        history: int = 8192,
        ship_limit: int = 16384,
        drift: DriftConfig | None = None,
        records_meta: Mapping[str, str] | None = None,
    ) -> None:
        if history < 1 or ship_limit < 0:
            raise ValueError(f"need history >= 1, ship_limit >= 0, got {history}, {ship_limit}")
        self.history, self.ship_limit = history, ship_limit
        self._drift_config = drift
        self.monitor = DriftMonitor(gate, drift)
        self._recent: deque[RecordSet] = deque()
        self._unsent: deque[RecordSet] = deque()
        self._meta = dict(records_meta or {})
        self._lock = threading.Lock()  # the engine thread writes, the event loop flushes
        self._pending = RecordWriter(self._meta)  # every verified node since the last flush

    @property
    def gate(self) -> GatePolicy:
        return self.monitor.policy

    def set_gate(self, gate: GatePolicy) -> None:
        if gate.version != self.monitor.policy.version:
            self.monitor = DriftMonitor(gate, self._drift_config)

    def consume(self, report: StepReport) -> None:
        """Engine thread: keep the step's verified nodes for the next :meth:`flush`."""
        with self._lock:
            report.append_records(self._pending)

    def flush(self) -> bool:
        """Observe the records consumed since the last flush; False if there were none."""
        with self._lock:
            writer, self._pending = self._pending, RecordWriter(self._meta)
        if not len(writer):
            return False
        self.observe(writer.finish())
        return True

    def observe(self, records: RecordSet) -> None:
        if len(records) == 0:
            return
        samples = gate_samples(records)
        self.monitor.observe(samples.depth, samples.confidence, samples.accepted)
        _push(self._recent, records, self.history)
        if self.ship_limit:
            _push(self._unsent, records, self.ship_limit)

    def drift(self) -> DriftReport:
        return self.monitor.check()

    def curve(self, running: int, waiting: int, k_max: int, budget_step: int = 1) -> list[float]:
        rates = rank_acceptance(RecordSet.concat(list(self._recent))) if self._recent else None
        return marginal_utility(rates, running, waiting, k_max, budget_step)

    def take_unsent(self) -> RecordSet | None:
        """The records to ship with the next report (and forget them)."""
        if not self._unsent:
            return None
        out = RecordSet.concat(list(self._unsent))
        self._unsent.clear()
        return out


def _push(parts: deque[RecordSet], records: RecordSet, limit: int) -> None:
    """Append, then drop whole oldest parts while the newest ``limit`` records remain."""
    parts.append(records)
    while len(parts) > 1 and sum(len(p) for p in parts) - len(parts[0]) >= limit:
        parts.popleft()
