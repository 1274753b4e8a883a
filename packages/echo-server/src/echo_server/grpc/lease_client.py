"""Node side of the budget protocol: register, report, watch leases, fall back, re-register.

A session registers, then runs two loops until the controller no longer knows the registration:

- watch: WatchPolicy's stream of leases; each lease whose epoch is above the last one applied
  caps the engine's K between steps, and a new gate policy version (its JSON arrives on the
  stream the first time) swaps the ECHO policy's gates between steps;
- report: every ``report_interval_ms`` the load, the marginal-utility curve, the acceptance
  since the last report, the gate monitor's drift advice, new warm-up records, and the epoch
  applied (the acknowledgement the controller needs before it gives that budget elsewhere).

NOT_FOUND (the controller restarted, or dropped this node) ends the session and the node
registers again at once; the registration's lease is applied whatever its epoch (it answers our
own call, so it is the live controller's). FAILED_PRECONDITION means another process registered
this node id: a ``node_id_conflict`` warning names it, and the node registers again after a
jittered exponential backoff (:class:`~echo_server.grpc.backoff.Backoff`, up to
``CONFLICT_BACKOFF_S[1]``), so two processes with one id settle to a few registrations a
minute instead of fighting. UNAVAILABLE is retried with backoff too.

Budget fallback: a node following a controller runs with K = ``FALLBACK_K`` (0: plain decoding,
the same output, no draft tokens) whenever it holds no live lease: before its first lease, and
once a lease's TTL (counted from receipt on this node's monotonic clock) runs out unrenewed. It
never falls back to its local ``--budget``: the controller may hand a silent node's budget to
the others ``ttl + slack`` after issuing it, so only K = 0 keeps ``sum(effective K) <= G`` while
the controller is down, restarting or cut off (the echo-server README states the invariant).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import structlog

from echo_controller.errors import ControlPlaneError
from echo_controller.security import ClientTls, auth_metadata, open_channel
from echo_core.errors import EchoError
from echo_core.stats import AcceptanceTotals
from echo_gating.policy import GatePolicy
from echo_proto.budget.v1 import budget_pb2 as bpb
from echo_proto.budget.v1 import budget_pb2_grpc
from echo_server.grpc import convert
from echo_server.grpc.backoff import Backoff
from echo_server.node.drift import GateObserver
from echo_server.node.engine_thread import EngineThread
from echo_server.node.lease import NodeIdentity, NodeReport, ReceivedLease
from echo_server.node.metrics import NodeMetrics

log = structlog.get_logger(__name__)

REREGISTER = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
CALL_TIMEOUT_S = 5.0
BACKOFF_S = (0.1, 2.0)  # first and longest wait between failed attempts
CONFLICT_BACKOFF_S = (0.5, 30.0)  # the same, after another process took this node id
FALLBACK_K = 0  # K without a live lease (module docstring)


class _ReregisterError(Exception):
    """The controller does not know this registration any more (``code`` says why)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code

    @classmethod
    def of(cls, exc: grpc.aio.AioRpcError) -> _ReregisterError:
        return cls(exc.code(), exc.details() or exc.code().name)


class LeaseClient:
    def __init__(
        self,
        target: str,
        identity: NodeIdentity,
        worker: EngineThread,
        observer: GateObserver,
        *,
        tls: ClientTls | None = None,
        token: str | None = None,
        metrics: NodeMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        conflict_backoff: Backoff | None = None,
    ) -> None:
        self.identity, self._worker, self._observer = identity, worker, observer
        self._channel = open_channel(target, tls)
        self._stub = budget_pb2_grpc.BudgetControllerStub(self._channel)
        self._metadata = auth_metadata(token)
        self._metrics, self._clock = metrics, clock
        self._lease: ReceivedLease | None = None
        self._fence = 0  # highest epoch applied
        self._registration = 0
        self._interval_s = 1.0
        self._policies: dict[str, GatePolicy] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._last_steps = 0  # engine steps at the previous report
        self._last_totals = AcceptanceTotals()  # acceptance counts at the previous report
        self._last_report = clock()
        self._conflicts = conflict_backoff or Backoff(*CONFLICT_BACKOFF_S)
        self.registrations = 0
        self.conflicts = 0  # sessions ended because another process registered this node id

    @property
    def lease(self) -> ReceivedLease | None:
        """The live lease, None while the node runs its local policy."""
        lease = self._lease
        return lease if lease is not None and lease.live(self._clock()) else None

    async def run(self) -> None:
        """Sessions until cancelled (module docstring); K = FALLBACK_K until the first lease."""
        await self._worker.set_budget_override(FALLBACK_K)
        retry = Backoff(*BACKOFF_S, jitter=False)
        while True:
            try:
                await self._register()
                retry.reset()
                await self._session()
            except _ReregisterError as exc:
                if exc.code is grpc.StatusCode.FAILED_PRECONDITION:
                    await self._conflict(str(exc))
                else:
                    self._conflicts.reset()
                    log.info("controller_forgot_node", reason=str(exc))
                continue
            except grpc.aio.AioRpcError as exc:
                log.warning("controller_unreachable", code=exc.code().name, details=exc.details())
            except (ControlPlaneError, EchoError) as exc:  # FieldError from convert
                log.warning("controller_sent_bad_message", error=str(exc))
            self._conflicts.reset()
            await asyncio.sleep(retry.next())

    async def _conflict(self, details: str) -> None:
        """Another process registered this node id: say so, back off, then register again."""
        self.conflicts += 1
        wait_s = self._conflicts.next()
        log.warning(
            "node_id_conflict",
            node_id=self.identity.node_id,
            consecutive=self._conflicts.attempts,
            retry_in_s=round(wait_s, 2),
            details=details,
            hint="another process registered this node id: give each node its own --node-id",
        )
        await asyncio.sleep(wait_s)

    async def close(self, deregister: bool = True) -> None:
        """Stop using the lease, tell the controller (best effort), close the channel."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._lease = None
        await self._worker.set_budget_override(FALLBACK_K)
        if deregister and self._registration:
            try:
                await self._stub.Deregister(
                    bpb.DeregisterRequest(
                        node_id=self.identity.node_id, registration_epoch=self._registration
                    ),
                    metadata=self._metadata,
                    timeout=1.0,
                )
            except grpc.aio.AioRpcError as exc:
                log.info("deregister_failed", code=exc.code().name)
        await self._channel.close()

    # -- one session ---------------------------------------------------------------------------

    async def _register(self) -> None:
        response = await self._stub.RegisterNode(
            convert.register_request(self.identity),
            metadata=self._metadata,
            timeout=CALL_TIMEOUT_S,
        )
        self._registration = response.registration_epoch
        self._interval_s = max(response.report_interval_ms, 1) / 1000
        self._fence = 0  # the registration's lease comes from the live controller
        self.registrations += 1
        log.info("registered", node_id=self.identity.node_id, epoch=response.lease.epoch)
        await self._apply(response.lease)

    async def _session(self) -> None:
        tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._report_loop())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # raises what ended the session
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self) -> None:
        retry = Backoff(*BACKOFF_S, jitter=False)
        request = bpb.WatchPolicyRequest(
            node_id=self.identity.node_id, registration_epoch=self._registration
        )
        while True:
            try:
                async for message in self._stub.WatchPolicy(request, metadata=self._metadata):
                    if message.HasField("gate_policy"):
                        policy = convert.gate_policy(message.gate_policy)
                        self._policies[policy.version] = policy
                    await self._apply(message.lease)
                    retry.reset()
            except grpc.aio.AioRpcError as exc:
                if exc.code() in REREGISTER:
                    raise _ReregisterError.of(exc) from exc
                log.info("watch_interrupted", code=exc.code().name)
            await asyncio.sleep(retry.next())

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self._stub.Report(
                    convert.report_request(
                        self.identity.node_id, self._registration, self._report()
                    ),
                    metadata=self._metadata,
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in REREGISTER:
                    raise _ReregisterError.of(exc) from exc
                log.info("report_failed", code=exc.code().name)

    def _report(self) -> NodeReport:
        snap, now = self._worker.snapshot, self._clock()
        totals = AcceptanceTotals(
            snap.request_steps_total, snap.verified_total, snap.accepted_total
        )
        window, self._last_totals = totals - self._last_totals, totals
        steps, self._last_steps = snap.steps_total - self._last_steps, snap.steps_total
        window_ms = int((now - self._last_report) * 1000)
        self._last_report = now
        drift = self._observer.drift()
        lease = self.lease
        return NodeReport(
            running=snap.running,
            waiting=snap.waiting,
            utility=tuple(self._observer.curve(snap.running, snap.waiting, self.identity.k_max)),
            budget_step=1,
            window_ms=max(window_ms, 0),
            steps=steps,
            verified=window.verified,
            accepted=window.accepted,
            mean_accepted_length=window.mean_accepted_length,
            lease_epoch=lease.epoch if lease is not None else 0,
            gate_policy_version=self._observer.gate.version,
            records=self._observer.take_unsent(),
            drift_reason=drift.reason if drift.recalibrate else None,
        )

    # -- applying leases -------------------------------------------------------------------------

    async def _apply(self, message: bpb.Lease) -> None:
        lease = convert.received_lease(message, self._clock())
        if lease.epoch <= self._fence:
            log.debug("stale_lease_ignored", epoch=lease.epoch, fence=self._fence)
            return
        self._fence = lease.epoch
        if self._expiry is not None:
            self._expiry.cancel()
        # The engine applies K between steps; only then is the lease acknowledged (reports
        # send self.lease's epoch), else the controller could hand a decrease to another node
        # while this engine still runs the old, larger K.
        await self._worker.set_budget_override(min(lease.budget_k, self.identity.k_max))
        self._lease = lease
        loop = asyncio.get_running_loop()
        remaining_s = max(0.0, lease.expires_at - self._clock())  # the TTL runs from receipt
        self._expiry = loop.call_later(remaining_s, self._expire, lease.epoch)
        if self._metrics is not None:
            self._metrics.on_lease(lease)
        version = lease.gate_policy_version
        policy = self._policies.get(version)
        switch = version and version != self._observer.gate.version and policy is not None
        if switch and policy is not None and await self._worker.set_gate(policy):
            self._observer.set_gate(policy)
            log.info("gate_policy_switched", version=version)

    def _expire(self, epoch: int) -> None:
        if self._lease is None or self._lease.epoch != epoch:
            return
        log.info("lease_expired_fallback", epoch=epoch, k=FALLBACK_K)
        self._lease = None
        self._expiry = None
        if self._metrics is not None:
            self._metrics.on_lease(None)
        task = asyncio.ensure_future(self._worker.set_budget_override(FALLBACK_K))
        task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("lease_fallback_failed", error=str(task.exception()))
