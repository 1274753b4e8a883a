"""Prometheus metrics of a serving node (the controller's: :mod:`echo_controller.metrics`).

The README's "gRPC control plane" section lists every metric. Each process serves its registry
over HTTP (``--metrics-listen``, :func:`echo_controller.metrics.serve_metrics`); nothing is
registered in prometheus-client's global registry, so several servers can live in one test
process.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from echo_controller.metrics import sync_labels
from echo_gating.drift import DriftReport
from echo_server.engine.cost_feedback import CostSnapshot
from echo_server.node.items import RequestSummary
from echo_server.node.lease import ReceivedLease
from echo_server.node.stats import NodeSnapshot, StepSample

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

__all__ = ["LATENCY_BUCKETS", "TOKEN_BUCKETS", "NodeMetrics"]


class NodeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "echo_node_requests", "Finished requests by finish reason", ["reason"], registry=r
        )
        self.refused = Counter(
            "echo_node_requests_refused", "Requests refused by status code", ["code"], registry=r
        )
        self.output_tokens = Counter("echo_node_output_tokens", "Tokens emitted", registry=r)
        self.steps = Counter("echo_node_steps", "Engine steps", registry=r)
        self.verified = Counter(
            "echo_node_draft_tokens_verified", "Draft tokens verified", registry=r
        )
        self.accepted = Counter(
            "echo_node_draft_tokens_accepted", "Draft tokens accepted", registry=r
        )
        self.verified_per_step = Histogram(
            "echo_node_verified_tokens_per_step",
            "Draft tokens verified per step (bounded by K)",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "echo_node_request_seconds", "Arrival to finish", buckets=LATENCY_BUCKETS, registry=r
        )
        self.ttft_seconds = Histogram(
            "echo_node_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.running = Gauge("echo_node_running_requests", "Requests running", registry=r)
        self.waiting = Gauge("echo_node_waiting_requests", "Requests queued", registry=r)
        self.tokens_per_second = Gauge(
            "echo_node_tokens_per_second", "Output tokens/s over the stats window", registry=r
        )
        self.mean_accepted_length = Gauge(
            "echo_node_mean_accepted_length",
            "Tokens per request per step over the stats window",
            registry=r,
        )
        self.draft_yield = Gauge(
            "echo_node_draft_yield", "Accepted / verified draft tokens (window)", registry=r
        )
        self.budget_k = Gauge("echo_node_budget_k", "Budget K in force", registry=r)
        self.lease_budget_k = Gauge(
            "echo_node_lease_budget_k", "K of the live lease (0: none)", registry=r
        )
        self.lease_epoch = Gauge("echo_node_lease_epoch", "Epoch of the live lease", registry=r)
        self.lease_live = Gauge("echo_node_lease_live", "1 while a lease is live", registry=r)
        self.truncation = Gauge(
            "echo_node_gate_truncation_rate",
            "Fraction of requests a checkpoint truncates",
            ["depth"],
            registry=r,
        )
        self.predicted = Gauge(
            "echo_node_gate_acceptance_predicted",
            "Acceptance at a depth predicted by the gate calibration",
            ["depth"],
            registry=r,
        )
        self.realised = Gauge(
            "echo_node_gate_acceptance_realised",
            "Acceptance at a depth observed",
            ["depth"],
            registry=r,
        )
        self.drift = Gauge("echo_node_gate_drift", "1 while recalibration is advised", registry=r)
        self.gate_version = Gauge(
            "echo_node_gate_policy", "1 for the gate policy version in use", ["version"], registry=r
        )
        self.cost_live = Gauge(
            "echo_node_verify_cost_live_seconds",
            "Windowed median of live verify passes over this many rows (ready buckets)",
            ["rows"],
            registry=r,
        )
        self.cost_profile = Gauge(
            "echo_node_verify_cost_profile_seconds",
            "The start-up profile's verify seconds at this many rows",
            ["rows"],
            registry=r,
        )
        self.cost_curve = Gauge(
            "echo_node_verify_cost_curve_seconds",
            "The verify curve in use (profile, or corrected from live steps) at this many rows",
            ["rows"],
            registry=r,
        )
        self.cost_samples = Gauge(
            "echo_node_verify_cost_samples",
            "Live verify samples in this row count's window",
            ["rows"],
            registry=r,
        )
        self.cost_source = Gauge(
            "echo_node_verify_profile_source",
            "1 for how the start-up profile was obtained (cached, fresh, unsettled, none)",
            ["source"],
            registry=r,
        )
        self.cost_swaps = Gauge(
            "echo_node_verify_cost_corrections",
            "Corrected verify curves put in use since start",
            registry=r,
        )
        self._cost_seen: CostSnapshot | None = None

    def on_step(self, step: StepSample) -> None:
        self.steps.inc()
        self.output_tokens.inc(step.emitted)
        self.verified.inc(step.acceptance.verified)
        self.accepted.inc(step.acceptance.accepted)
        if step.decode_passes:
            self.verified_per_step.observe(step.acceptance.verified / step.decode_passes)
        if step.cost is not None and step.cost is not self._cost_seen:
            self.on_cost(step.cost)

    def on_cost(self, cost: CostSnapshot) -> None:
        """The verify-cost model (engine/cost_feedback.py), per row count."""
        self._cost_seen = cost
        sync_labels(self.cost_source, {cost.source: 1})
        self.cost_swaps.set(cost.swaps)
        for gauge, field in (
            (self.cost_live, "live_s"),
            (self.cost_profile, "profile_s"),
            (self.cost_curve, "curve_s"),
        ):
            values = {str(b.rows): getattr(b, field) for b in cost.buckets}
            sync_labels(gauge, {k: v for k, v in values.items() if v is not None})
        sync_labels(self.cost_samples, {str(b.rows): b.samples for b in cost.buckets})

    def on_finish(self, summary: RequestSummary) -> None:
        self.requests.labels(summary.finish_reason.value).inc()
        self.request_seconds.observe(summary.total_ms / 1000)
        self.ttft_seconds.observe(summary.ttft_ms / 1000)

    def on_snapshot(self, snap: NodeSnapshot) -> None:
        self.running.set(snap.running)
        self.waiting.set(snap.waiting)
        self.tokens_per_second.set(snap.tokens_per_second)
        self.mean_accepted_length.set(snap.mean_accepted_length)
        self.draft_yield.set(snap.draft_yield)
        self.budget_k.set(snap.budget_k)
        sync_labels(self.gate_version, {snap.gate_policy_version: 1})

    def on_lease(self, lease: ReceivedLease | None) -> None:
        self.lease_live.set(lease is not None)
        self.lease_budget_k.set(lease.budget_k if lease is not None else 0)
        self.lease_epoch.set(lease.epoch if lease is not None else 0)

    def on_drift(self, report: DriftReport) -> None:
        self.drift.set(report.recalibrate)
        for h in report.depths:
            depth = str(h.depth)
            self.predicted.labels(depth).set(h.predicted)
            self.realised.labels(depth).set(h.realised)
            if not math.isnan(h.truncated):
                self.truncation.labels(depth).set(h.truncated)
