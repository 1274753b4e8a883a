"""One serving node without its transports: the engine thread, the drift observer its step
reports feed, the metrics, and the lease follower when a controller leads.

The gRPC API (:mod:`echo_server.grpc`) and the HTTP API (:mod:`echo_server.http`) are adapters
over :attr:`Node.worker` and :attr:`Node.metrics`; ``echo-sd serve`` (:mod:`echo_server.cli.serve`)
assembles the process: a :class:`Node`, the listeners it asks for, and the gRPC lease client as
the node's :class:`LeaseFollower`.

Life cycle: :meth:`Node.start` (the engine thread), :meth:`Node.run_background` (the observer's
loop and the follower, once the node id is known), :meth:`Node.drain` (admit nothing more, let
in-flight requests finish within the grace period, stop the background tasks, release the lease),
:meth:`Node.close` (the engine thread).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Protocol

import structlog

from echo_gating.policy import GatePolicy
from echo_server.engine import Engine
from echo_server.engine.memory import memory_report, trim_heap
from echo_server.node.drift import GateObserver
from echo_server.node.engine_thread import EngineThread
from echo_server.node.lease import NodeIdentity, ReceivedLease
from echo_server.node.metrics import NodeMetrics

log = structlog.get_logger(__name__)


class LeaseFollower(Protocol):
    """What the node needs of a budget-protocol client (the gRPC one: ``grpc.lease_client``)."""

    identity: NodeIdentity

    @property
    def lease(self) -> ReceivedLease | None: ...

    async def run(self) -> None: ...

    async def close(self) -> None: ...


class Node:
    """The engine thread, its drift observer and metrics, and an optional lease follower."""

    def __init__(
        self,
        engine: Engine,
        identity: NodeIdentity,
        *,
        max_waiting: int = 32,
        window_s: float = 10.0,
        observe_interval_s: float = 1.0,
    ) -> None:
        self.identity = identity
        self.observe_interval_s = observe_interval_s
        self.metrics = NodeMetrics()
        meta = {"target": identity.target, "drafter": identity.drafter}
        gate = engine.policy.active_gate() or GatePolicy.none()
        self.observer = GateObserver(gate, records_meta=meta)
        self.worker = EngineThread(
            engine,
            max_waiting=max_waiting,
            window_s=window_s,
            on_step=self.metrics.on_step,
            on_finish=self.metrics.on_finish,
            consumers=(self.observer.consume,),
        )
        self.follower: LeaseFollower | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def follow(self, follower: LeaseFollower) -> None:
        """Take K from ``follower``'s leases (before :meth:`run_background`)."""
        self.follower = follower

    def lease(self) -> ReceivedLease | None:
        """The lease held now (None: standalone, or none live)."""
        return self.follower.lease if self.follower is not None else None

    def set_node_id(self, node_id: str) -> None:
        """The node id, once known (from the bound port: :mod:`echo_server.node.identity`)."""
        self.identity = replace(self.identity, node_id=node_id)
        if self.follower is not None:
            self.follower.identity = self.identity

    async def start(self) -> None:
        """Log what the process holds and start the engine thread."""
        trimmed = trim_heap()
        engine = self.worker.engine
        held = memory_report(engine.model, engine.kv.storage, engine.drafter)
        log.info("node_memory", trimmed_mib=round(trimmed / 2**20, 1), **held.log_fields())
        self.worker.start()

    def run_background(self) -> None:
        """Start the observer's loop and the follower's session."""
        self._tasks.append(asyncio.create_task(self._observe()))
        if self.follower is not None:
            self._tasks.append(asyncio.create_task(self.follower.run()))

    async def drain(self, grace_s: float) -> int:
        """Admit nothing more, let in-flight requests finish within ``grace_s`` (then cancel
        them), stop the background tasks and release the lease; returns how many were
        cancelled."""
        cancelled = await self.worker.drain(grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.follower is not None:
            with contextlib.suppress(Exception):
                await self.follower.close()
        return cancelled

    async def close(self) -> None:
        """Stop the engine thread (after :meth:`drain`)."""
        await self.worker.close()

    async def _observe(self) -> None:
        """Every ``observe_interval_s``: the drift observer reads what the step reports left it,
        the gauges follow the observer and the stats snapshot."""
        while True:
            await asyncio.sleep(self.observe_interval_s)
            if self.observer.flush():
                self.metrics.on_drift(self.observer.drift())
            self.metrics.on_snapshot(self.worker.snapshot)
