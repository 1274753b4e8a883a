"""Prometheus metrics of the budget controller, and the helpers serving nodes share.

The echo-server README's "gRPC control plane" section lists every metric. Each process serves
its registry over HTTP(S) (``--metrics-listen``, :mod:`echo_controller.metrics_http`); nothing
is registered in prometheus-client's global registry, so several servers can live in one test
process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge


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
        sync_labels(self.node_committed, committed)
        sync_labels(self.pool_committed, pools)
        sync_labels(self.pool_budget, {pool: budgets[pool] for pool in pools})

    def forget(self, node: str) -> None:
        for gauge in (self.node_yield, self.node_mal):
            with contextlib.suppress(KeyError):
                gauge.remove(node)


def sync_labels(gauge: Gauge, values: Mapping[str, float]) -> None:
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
