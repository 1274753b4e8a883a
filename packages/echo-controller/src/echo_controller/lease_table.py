"""The budget controller's state: registered nodes, their leases, and the split of each pool.

Every pool (nodes sharing compute) has a global budget ``G``. A node's *committed* budget is the
largest budget among its leases that may still be in use: issued and neither expired
(``issued + ttl + slack``: the node counts the TTL from receipt, ``slack`` bounds the delivery
delay) nor superseded (the node acknowledged a newer epoch in a report; it ignores older ones).
Leases of a replaced registration stay committed until they expire: the old process may live.

Invariant, at all times and for every pool: ``sum(committed) <= G``.

A re-split (on every report, registration, deregistration and expiry) computes targets by
water-filling (:mod:`echo_controller.water_fill`) on the nodes' latest marginal-utility curves
(caps = their ``k_max``), then shares what nobody has a use for evenly ("idle share": budget
costs nothing while unused, and a node that turns busy needs no report window to get some).
Leases are then issued in order of ``target - committed`` (decreases first): each new budget is
clipped to what the others' committed budgets leave, so an increase waits until the decreases it
needs are acknowledged or expired. A node that has not reported for a TTL gets no new lease;
when its last lease expires it is dropped and its budget goes to the others.

Epochs are ``incarnation << 32 | counter``: the incarnation grows across controller restarts,
so leases of a new controller always fence those of an old one.

Restarts: a new controller does not know the leases its predecessor issued, and those may be in
use for up to ``ttl + slack`` after it died. A table built with ``quarantine_until`` (the
restarted process's start plus ``ttl + slack``) therefore grants only K = 0 until then: the sum
of new leases plus any predecessor's live ones stays <= G. Nodes serve on with K = 0 meanwhile
(the fallback of ``echo_server.grpc.lease_client``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from echo_controller.errors import StaleRegistrationError, UnknownNodeError
from echo_controller.water_fill import water_fill

EPOCH_COUNTER_BITS = 32


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    global_budget: int  # G of every pool without an entry in pool_budgets
    pool_budgets: Mapping[str, int] = field(default_factory=dict)
    ttl_ms: int = 5000
    slack_ms: int = 1000  # longest lease delivery the invariant tolerates
    report_interval_ms: int = 1000

    def __post_init__(self) -> None:
        budgets = [self.global_budget, *self.pool_budgets.values()]
        if any(b < 0 for b in budgets):
            raise ValueError(f"pool budgets must be >= 0, got {budgets}")
        if self.ttl_ms < 1 or self.slack_ms < 0 or self.report_interval_ms < 1:
            raise ValueError(
                f"need ttl_ms >= 1, slack_ms >= 0, report_interval_ms >= 1, got {self.ttl_ms}, "
                f"{self.slack_ms}, {self.report_interval_ms}"
            )
        if self.report_interval_ms >= self.ttl_ms:
            raise ValueError(
                f"report_interval_ms ({self.report_interval_ms}) must be below ttl_ms "
                f"({self.ttl_ms}) or every lease lapses between renewals"
            )

    def budget_of(self, pool: str) -> int:
        return self.pool_budgets.get(pool, self.global_budget)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    pool: str  # "" = a pool of its own
    k_max: int
    target: str = ""  # model pair: calibration is shared within one pair
    drafter: str = ""

    @property
    def pool_key(self) -> str:
        return self.pool or f"node:{self.node_id}"


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    node_id: str
    budget_k: int
    epoch: int
    ttl_ms: int


@dataclass(slots=True)
class _Lease:
    epoch: int
    budget: int
    expires: float  # controller monotonic seconds


@dataclass(slots=True)
class _Node:
    spec: NodeSpec
    registration: int
    last_seen: float
    curve: tuple[float, ...] = ()  # utility per budget token, non-increasing
    leases: list[_Lease] = field(default_factory=list)
    newest_epoch: int = 0
    current: int = 0  # budget of the newest lease


class LeaseTable:
    """Nodes, leases and splits; every method takes ``now`` (monotonic seconds)."""

    def __init__(
        self, config: LeaseConfig, incarnation: int, quarantine_until: float | None = None
    ) -> None:
        """``quarantine_until``: monotonic time before which every grant is 0 (module doc)."""
        if not 0 < incarnation < 1 << (64 - EPOCH_COUNTER_BITS):
            raise ValueError(f"incarnation must be in [1, 2^32), got {incarnation}")
        self.config = config
        self.quarantine_until = quarantine_until
        self._epoch = incarnation << EPOCH_COUNTER_BITS
        self._nodes: dict[str, _Node] = {}
        self._orphans: dict[str, list[list[_Lease]]] = {}  # pool -> replaced registrations

    # -- calls from nodes --------------------------------------------------------------------

    def register(self, spec: NodeSpec, now: float) -> tuple[int, list[LeaseGrant]]:
        """Add or replace a node; returns its registration epoch and the leases to send."""
        old = self._nodes.pop(spec.node_id, None)
        if old is not None:
            self._orphans.setdefault(old.spec.pool_key, []).append(old.leases)
        registration = self._next_epoch()
        self._nodes[spec.node_id] = _Node(spec, registration, last_seen=now)
        pools = {spec.pool_key} | ({old.spec.pool_key} if old is not None else set())
        return registration, self._resplit(pools, now, renew={spec.node_id})

    def report(
        self,
        node_id: str,
        registration: int,
        acked_epoch: int,
        curve: Sequence[float],
        now: float,
    ) -> list[LeaseGrant]:
        """A node's report: new curve (utility per budget token, non-increasing), acknowledgement
        of the epoch it applies; renews it."""
        node = self._node(node_id, registration)
        node.last_seen, node.curve = now, tuple(float(v) for v in curve)
        if 0 < acked_epoch <= node.newest_epoch:
            node.leases = [lease for lease in node.leases if lease.epoch >= acked_epoch]
        return self._resplit({node.spec.pool_key}, now, renew={node_id})

    def deregister(self, node_id: str, registration: int, now: float) -> list[LeaseGrant]:
        """Remove a node that stopped using its lease; unknown or stale calls change nothing."""
        node = self._nodes.get(node_id)
        if node is None or registration not in (0, node.registration):
            return []
        del self._nodes[node_id]
        return self._resplit({node.spec.pool_key}, now, renew=set())

    def check(self, node_id: str, registration: int) -> NodeSpec:
        """The node's spec, if ``registration`` is its current one (else the error to send)."""
        return self._node(node_id, registration).spec

    # -- time --------------------------------------------------------------------------------

    def expire(self, now: float) -> tuple[list[str], list[LeaseGrant]]:
        """Drop expired leases and dead nodes, end the quarantine; returns the dropped ids and the
        leases to send."""
        changed: set[str] = set()
        if self.quarantine_until is not None and now >= self.quarantine_until:
            self.quarantine_until = None
            changed |= {node.spec.pool_key for node in self._nodes.values()}
        for pool, groups in list(self._orphans.items()):
            kept = [g for g in ([x for x in g if x.expires > now] for g in groups) if g]
            if sum(map(len, kept)) != sum(map(len, groups)):
                changed.add(pool)
            if kept:
                self._orphans[pool] = kept
            else:
                del self._orphans[pool]
        dropped = []
        for node in list(self._nodes.values()):
            live = [lease for lease in node.leases if lease.expires > now]
            if len(live) != len(node.leases):
                node.leases = live
                changed.add(node.spec.pool_key)
            if not live and not self._alive(node, now):
                del self._nodes[node.spec.node_id]
                dropped.append(node.spec.node_id)
        return dropped, self._resplit(changed, now, renew=set())

    # -- views -------------------------------------------------------------------------------

    def nodes(self) -> list[NodeSpec]:
        return [node.spec for node in self._nodes.values()]

    def committed(self, now: float) -> dict[str, int]:
        """Node id -> committed budget (see the module docstring)."""
        return {nid: _committed(node, now) for nid, node in self._nodes.items()}

    def pool_committed(self, now: float) -> dict[str, int]:
        """Pool -> sum of committed budgets, orphaned leases included (<= the pool's G)."""
        out = {pool: _orphaned(groups, now) for pool, groups in self._orphans.items()}
        for node in self._nodes.values():
            out[node.spec.pool_key] = out.get(node.spec.pool_key, 0) + _committed(node, now)
        return out

    def current(self, node_id: str) -> LeaseGrant | None:
        """The newest lease of a node, re-sent as is (e.g. to a new WatchPolicy stream)."""
        node = self._nodes.get(node_id)
        if node is None or not node.leases:
            return None
        newest = max(node.leases, key=lambda lease: lease.epoch)
        return LeaseGrant(node_id, newest.budget, newest.epoch, self.config.ttl_ms)

    # -- internals ---------------------------------------------------------------------------

    def _node(self, node_id: str, registration: int) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise UnknownNodeError(f"node {node_id!r} is not registered (register again)")
        if registration != node.registration:
            raise StaleRegistrationError(
                f"node {node_id!r}: registration {registration} was replaced by "
                f"{node.registration} (register again)"
            )
        return node

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def _alive(self, node: _Node, now: float) -> bool:
        return now - node.last_seen <= self.config.ttl_ms / 1000

    def _resplit(self, pools: Iterable[str], now: float, renew: set[str]) -> list[LeaseGrant]:
        grants: list[LeaseGrant] = []
        for pool in sorted(pools):
            members = sorted(
                (n for n in self._nodes.values() if n.spec.pool_key == pool),
                key=lambda n: n.spec.node_id,
            )
            alive = [n for n in members if self._alive(n, now)]
            quarantined = self.quarantine_until is not None and now < self.quarantine_until
            budget = 0 if quarantined else self.config.budget_of(pool)
            targets = split_budget([n.curve for n in alive], [n.spec.k_max for n in alive], budget)
            total = _orphaned(self._orphans.get(pool, []), now) + sum(
                _committed(n, now) for n in members
            )
            order = sorted(
                zip(alive, targets, strict=True), key=lambda p: p[1] - _committed(p[0], now)
            )
            for node, target in order:
                mine = _committed(node, now)
                new = max(0, min(target, budget - (total - mine)))
                if new == node.current and node.leases and node.spec.node_id not in renew:
                    continue
                epoch = self._next_epoch()
                expires = now + (self.config.ttl_ms + self.config.slack_ms) / 1000
                node.leases.append(_Lease(epoch, new, expires))
                node.newest_epoch, node.current = epoch, new
                total += max(mine, new) - mine
                grants.append(LeaseGrant(node.spec.node_id, new, epoch, self.config.ttl_ms))
        return grants


def split_budget(curves: Sequence[Sequence[float]], caps: Sequence[int], budget: int) -> list[int]:
    """Water-filling on the curves (caps = k_max), then the rest shared evenly up to the caps.

    Example: curves ``[0.9, 0.5]``, ``[]``, ``[]``, caps 4 each, budget 6: water-filling gives
    ``[2, 0, 0]`` (utility runs out); the idle share hands the remaining 4 out one per node below
    its cap per round: ``[3, 1, 1]``, then ``[4, 1, 1]``.
    """
    if not curves:
        return []
    filled = list(water_fill(curves, budget, caps=caps).budgets)
    left = budget - sum(filled)
    while left > 0:
        room = [i for i, (b, cap) in enumerate(zip(filled, caps, strict=True)) if b < cap]
        if not room:
            break
        give = room[:left]
        for i in give:
            filled[i] += 1
        left -= len(give)
    return filled


def _committed(node: _Node, now: float) -> int:
    return _max_live(node.leases, now)


def _orphaned(groups: list[list[_Lease]], now: float) -> int:
    return sum(_max_live(g, now) for g in groups)


def _max_live(leases: list[_Lease], now: float) -> int:
    return max((lease.budget for lease in leases if lease.expires > now), default=0)
