"""Prometheus metrics of a serving node and of the budget controller (one registry each).

The README's "gRPC control plane" section lists every metric. Each process serves its registry
over HTTP (``--metrics-listen``); nothing is registered in prometheus-client's global registry,
so several servers can live in one test process.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from echo_gating.drift import DriftReport
from echo_server.grpc.lease import ReceivedLease
from echo_server.grpc.node_stats import NodeSnapshot, StepReport
from echo_server.grpc.request_items import RequestSummary

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def serve_metrics(registry: CollectorRegistry, address: str) -> WSGIServer:
    """Serve ``registry`` at ``http://address/metrics`` (port 0 = any) from a daemon thread;
    ``server.server_port`` is the bound port, ``server.shutdown()`` stops it."""
    host, _, port = address.rpartition(":")
    server, _ = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    return server


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

    def on_step(self, step: StepReport) -> None:
        self.steps.inc()
        self.output_tokens.inc(step.emitted)
        self.verified.inc(step.verified)
        self.accepted.inc(step.accepted)
        if step.batch:
            self.verified_per_step.observe(step.verified)

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
        _sync(self.gate_version, {snap.gate_policy_version: 1})

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


class ControllerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.nodes = Gauge("echo_controller_nodes", "Registered nodes", registry=r)
        self.pool_budget = Gauge(
            "echo_controller_pool_budget_tokens", "Global budget G of a pool", ["pool"], registry=r
        )
        self.pool_committed = Gauge(
            "echo_controller_pool_committed_tokens",
            "Sum of budgets that may be in use in a pool (<= G)",
            ["pool"],
            registry=r,
        )
        self.node_committed = Gauge(
            "echo_controller_node_committed_k",
            "Budget a node may be using (its largest live lease)",
            ["node"],
            registry=r,
        )
        self.node_yield = Gauge(
            "echo_controller_node_draft_yield", "Draft yield a node reported", ["node"], registry=r
        )
        self.node_mal = Gauge(
            "echo_controller_node_mean_accepted_length",
            "Mean accepted length a node reported",
            ["node"],
            registry=r,
        )
        self.leases = Counter("echo_controller_leases_issued", "Leases issued", registry=r)
        self.reports = Counter("echo_controller_reports", "Reports received", registry=r)
        self.expired = Counter(
            "echo_controller_nodes_expired", "Nodes dropped after their lease expired", registry=r
        )
        self.refused = Counter(
            "echo_controller_calls_refused", "Calls refused by status code", ["code"], registry=r
        )
        self.recalibrations = Counter(
            "echo_controller_recalibrations", "Gate recalibrations", ["outcome"], registry=r
        )
        self.pooled_records = Gauge(
            "echo_controller_calibration_records",
            "Warm-up records pooled per model pair",
            ["target", "drafter"],
            registry=r,
        )

    def on_state(
        self,
        committed: Mapping[str, int],
        pools: Mapping[str, int],
        budgets: Mapping[str, int],
    ) -> None:
        self.nodes.set(len(committed))
        _sync(self.node_committed, committed)
        _sync(self.pool_committed, pools)
        _sync(self.pool_budget, {pool: budgets[pool] for pool in pools})

    def forget(self, node: str) -> None:
        for gauge in (self.node_yield, self.node_mal):
            with contextlib.suppress(KeyError):
                gauge.remove(node)


def _sync(gauge: Gauge, values: Mapping[str, float]) -> None:
    """Set one-label ``gauge`` to ``values`` and remove the labels no longer present (without a
    moment where a present label is missing, as ``clear()`` then ``set`` would have)."""
    for label, value in values.items():
        gauge.labels(label).set(value)
    present = {
        value
        for metric in gauge.collect()
        for sample in metric.samples
        for value in sample.labels.values()
    }
    for label in present - set(values):
        gauge.remove(label)
