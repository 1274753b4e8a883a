"""Node-side values of the budget protocol: the node's identity, its report, a received lease."""

from __future__ import annotations

from dataclasses import dataclass

from echo_gating.records import RecordSet


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What a node registers with (RegisterNodeRequest)."""

    node_id: str
    k_max: int  # the node's own ceiling on K; leases never exceed it
    pool: str = ""
    target: str = ""
    drafter: str = ""
    accelerator: str = "cpu"
    device_count: int = 1
    verify_cost: tuple[tuple[int, float], ...] = ()  # (total tokens, latency ms), ascending


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One periodic report (ReportRequest)."""

    running: int
    waiting: int
    utility: tuple[float, ...]  # per budget_step tokens, non-increasing, in [0, 1]
    budget_step: int
    window_ms: int
    steps: int
    verified: int
    accepted: int
    mean_accepted_length: float
    lease_epoch: int  # the lease applied now; 0 = local policy
    gate_policy_version: str
    records: RecordSet | None = None
    drift_reason: str | None = None  # set when the drift monitor advises recalibration


@dataclass(frozen=True, slots=True)
class ReceivedLease:
    """A lease as the node holds it: valid for ``ttl_ms`` from its own receipt time."""

    budget_k: int
    epoch: int
    ttl_ms: int
    gate_policy_version: str
    received_at: float  # node monotonic seconds

    @property
    def expires_at(self) -> float:
        return self.received_at + self.ttl_ms / 1000

    def live(self, now: float) -> bool:
        return now < self.expires_at
