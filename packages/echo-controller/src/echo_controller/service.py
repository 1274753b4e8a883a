"""The budget controller service (echo_proto.budget.v1) over a :class:`LeaseTable`.

The table holds the split and its invariant; this module speaks gRPC: it validates messages
(:mod:`.convert`), maps the table's errors to status codes (NOT_FOUND for an unknown node,
FAILED_PRECONDITION for a replaced registration, INVALID_ARGUMENT naming the field), pushes new
leases to the nodes' WatchPolicy streams (ended with FAILED_PRECONDITION when another
registration of the node id replaced theirs, NOT_FOUND when the node expired or deregistered:
a node backs off only on the former, an id conflict), expires silent nodes
(:meth:`expire_loop`), and runs calibration sharing when it has a pool: pooled warm-up records,
recalibration off the event loop when a node reports drift, the new GatePolicy version in the
next leases of that model pair (its JSON sent once per stream). Without a pool
(:mod:`.calibration`: it needs echo-gating) reports' records and drift advice are ignored and
leases carry no gate policy version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import structlog

from echo_controller import convert
from echo_controller.calibration import ModelPair
from echo_controller.errors import (
    CalibrationFailedError,
    ControlPlaneError,
    FieldError,
    StaleRegistrationError,
    UnknownNodeError,
)
from echo_controller.lease_table import LeaseGrant, LeaseTable
from echo_controller.metrics import ControllerMetrics
from echo_proto.budget.v1 import budget_pb2 as bpb
from echo_proto.budget.v1 import budget_pb2_grpc

if TYPE_CHECKING:  # the pool needs echo-gating: imported only where it is built
    from echo_controller.calibration_pool import CalibrationPool

log = structlog.get_logger(__name__)

SERVICE_NAME = bpb.DESCRIPTOR.services_by_name["BudgetController"].full_name


@dataclass(frozen=True, slots=True)
class _Closed:
    """Queued to a watcher whose registration ended: the status its stream ends with."""

    code: grpc.StatusCode
    reason: str


_REPLACED = _Closed(grpc.StatusCode.FAILED_PRECONDITION, "registration replaced")
_ENDED = _Closed(grpc.StatusCode.NOT_FOUND, "registration ended (register again)")


class BudgetControllerService(budget_pb2_grpc.BudgetControllerServicer):
    def __init__(
        self,
        table: LeaseTable,
        calibration: CalibrationPool | None,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table, self.calibration, self._metrics, self._clock = (
            table,
            calibration,
            metrics,
            clock,
        )
        self._watchers: dict[str, set[asyncio.Queue[LeaseGrant | _Closed]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def RegisterNode(  # noqa: N802 (gRPC method name)
        self,
        request: bpb.RegisterNodeRequest,
        context: grpc.aio.ServicerContext[bpb.RegisterNodeRequest, bpb.RegisterNodeResponse],
    ) -> bpb.RegisterNodeResponse:
        try:
            spec = convert.node_spec(request)
        except FieldError as exc:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, exc)
        if any(known.node_id == spec.node_id for known in self.table.nodes()):
            # a restarted node, or two processes with one id (each backs off; see lease_client)
            log.warning("node_registration_replaced", node_id=spec.node_id, pool=spec.pool_key)
        self._close_watchers(spec.node_id, _REPLACED)  # a replaced registration's streams end
        registration, grants = self.table.register(spec, self._clock())
        own = next(g for g in grants if g.node_id == spec.node_id)
        self._publish(grants)
        log.info("node_registered", node_id=spec.node_id, pool=spec.pool_key, k_max=spec.k_max)
        return bpb.RegisterNodeResponse(
            lease=self._lease(own),
            report_interval_ms=self.table.config.report_interval_ms,
            registration_epoch=registration,
        )

    async def Report(  # noqa: N802 (gRPC method name)
        self,
        request: bpb.ReportRequest,
        context: grpc.aio.ServicerContext[bpb.ReportRequest, bpb.ReportResponse],
    ) -> bpb.ReportResponse:
        pool = self.calibration
        try:
            convert.node_id(request.node_id)
            curve = convert.utility_curve(request.utility)
            records = pool.decode(request) if pool is not None else None
            grants = self.table.report(
                request.node_id,
                request.registration_epoch,
                request.lease_epoch,
                curve,
                self._clock(),
            )
        except ControlPlaneError as exc:
            await self._refuse(context, _code(exc), exc)
        spec = self.table.check(request.node_id, request.registration_epoch)
        pair = (spec.target, spec.drafter)
        if pool is not None and records is not None:
            pool.add(pair, records)
        if pool is not None and request.drift_detected:
            self._spawn(self._recalibrate(pool, pair, request.node_id, request.drift_reason))
        self._publish(grants)
        if self._metrics is not None:
            self._metrics.reports.inc()
            acc = request.acceptance
            verified = acc.draft_tokens_verified
            self._metrics.node_yield.labels(spec.node_id).set(
                acc.draft_tokens_accepted / verified if verified else 0.0
            )
            self._metrics.node_mal.labels(spec.node_id).set(acc.mean_accepted_length)
            if pool is not None:
                self._metrics.pooled_records.labels(*pair).set(pool.records(pair))
        return bpb.ReportResponse()

    async def WatchPolicy(  # noqa: N802 (gRPC method name)
        self,
        request: bpb.WatchPolicyRequest,
        context: grpc.aio.ServicerContext[bpb.WatchPolicyRequest, bpb.WatchPolicyResponse],
    ) -> AsyncIterator[bpb.WatchPolicyResponse]:
        try:
            spec = self.table.check(request.node_id, request.registration_epoch)
        except ControlPlaneError as exc:
            await self._refuse(context, _code(exc), exc)
        queue: asyncio.Queue[LeaseGrant | _Closed] = asyncio.Queue()
        self._watchers.setdefault(spec.node_id, set()).add(queue)
        sent: set[str] = set()  # gate policy versions this stream has carried
        try:
            current = self.table.current(spec.node_id)
            if current is not None:
                yield self._watch_message(current, sent)
            while not isinstance(grant := await queue.get(), _Closed):
                yield self._watch_message(grant, sent)
            ended = StaleRegistrationError(f"node {spec.node_id!r}: {grant.reason}")
            await self._refuse(context, grant.code, ended)
        finally:
            self._watchers.get(spec.node_id, set()).discard(queue)

    async def Deregister(  # noqa: N802 (gRPC method name)
        self,
        request: bpb.DeregisterRequest,
        context: grpc.aio.ServicerContext[bpb.DeregisterRequest, bpb.DeregisterResponse],
    ) -> bpb.DeregisterResponse:
        known = {s.node_id for s in self.table.nodes()}
        grants = self.table.deregister(request.node_id, request.registration_epoch, self._clock())
        if request.node_id in known and request.node_id not in {
            s.node_id for s in self.table.nodes()
        }:
            self._close_watchers(request.node_id, _ENDED)
            log.info("node_deregistered", node_id=request.node_id)
        self._publish(grants)
        return bpb.DeregisterResponse()

    # -- time and calibration ----------------------------------------------------------------

    async def expire_loop(self, period_s: float) -> None:
        """Expire leases and drop dead nodes every ``period_s`` (run as a task)."""
        while True:
            await asyncio.sleep(period_s)
            self.expire()

    def expire(self) -> None:
        dropped, grants = self.table.expire(self._clock())
        for node_id in dropped:
            log.info("node_expired", node_id=node_id)
            self._close_watchers(node_id, _ENDED)
            if self._metrics is not None:
                self._metrics.expired.inc()
                self._metrics.forget(node_id)
        self._publish(grants)

    async def _recalibrate(
        self, pool: CalibrationPool, pair: ModelPair, node_id: str, reason: str
    ) -> None:
        records = pool.claim(pair, self._clock())
        if records is None:
            return
        log.info("recalibrating", target=pair[0], drafter=pair[1], node_id=node_id, reason=reason)
        try:
            policy = await asyncio.to_thread(pool.recalibrate, records)
        except CalibrationFailedError as exc:
            pool.release(pair, self._clock())
            log.warning("recalibration_failed", error=str(exc))
            if self._metrics is not None:
                self._metrics.recalibrations.labels("failed").inc()
            return
        pool.install(pair, policy, self._clock())
        log.info("gate_policy_calibrated", version=policy.version, records=len(records))
        if self._metrics is not None:
            self._metrics.recalibrations.labels("ok").inc()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- helpers ---------------------------------------------------------------------------------

    def _gate_version(self, node_id: str) -> str:
        if self.calibration is None:
            return ""
        spec = next((s for s in self.table.nodes() if s.node_id == node_id), None)
        policy = self.calibration.policy((spec.target, spec.drafter)) if spec else None
        return policy.version if policy is not None else ""

    def _lease(self, grant: LeaseGrant) -> bpb.Lease:
        return convert.lease_message(grant, self._gate_version(grant.node_id), time.time())

    def _watch_message(self, grant: LeaseGrant, sent: set[str]) -> bpb.WatchPolicyResponse:
        lease = self._lease(grant)
        message = bpb.WatchPolicyResponse(lease=lease)
        version = lease.gate_policy_version
        if version and version not in sent and self.calibration is not None:
            policy = next(p for p in self.calibration.policies() if p.version == version)
            message.gate_policy.CopyFrom(convert.gate_artifact(policy))
            sent.add(version)
        return message

    def _publish(self, grants: list[LeaseGrant]) -> None:
        for grant in grants:
            for queue in self._watchers.get(grant.node_id, ()):
                queue.put_nowait(grant)
        if self._metrics is not None:
            now = self._clock()
            self._metrics.leases.inc(len(grants))
            pools = self.table.pool_committed(now)
            budgets = {pool: self.table.config.budget_of(pool) for pool in pools}
            self._metrics.on_state(self.table.committed(now), pools, budgets)

    def _close_watchers(self, node_id: str, closed: _Closed) -> None:
        for queue in self._watchers.pop(node_id, set()):
            queue.put_nowait(closed)

    async def _refuse(
        self, context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, exc: Exception
    ) -> NoReturn:
        if self._metrics is not None:
            self._metrics.refused.labels(code.name).inc()
        await context.abort(code, str(exc))


def _code(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, UnknownNodeError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, StaleRegistrationError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INVALID_ARGUMENT
