"""The controller's lease table: splits, acknowledgements, expiry, fencing, and the invariant."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_controller.errors import StaleRegistrationError, UnknownNodeError
from echo_controller.lease_table import (
    LeaseConfig,
    LeaseGrant,
    LeaseTable,
    NodeSpec,
    split_budget,
)

TTL_S, SLACK_S = 2.0, 0.5
CONFIG = LeaseConfig(global_budget=12, ttl_ms=2000, slack_ms=500, report_interval_ms=500)
NO_UTILITY: list[float] = []


def _node(i: int, k_max: int = 8, pool: str = "dp") -> NodeSpec:
    return NodeSpec(f"n{i}", pool, k_max, "target", "drafter")


def _latest(grants: list[LeaseGrant]) -> dict[str, LeaseGrant]:
    return {g.node_id: g for g in grants}


def _start(n: int) -> tuple[LeaseTable, dict[str, int]]:
    """n registered nodes that reported and acknowledged their leases until the split settled."""
    table, regs, newest = LeaseTable(CONFIG, incarnation=1), {}, {}
    for i in range(n):
        regs[f"n{i}"], grants = table.register(_node(i), 0.0)
        newest.update({g.node_id: g.epoch for g in grants})
    for _ in range(3):
        for nid, reg in regs.items():
            grants = table.report(nid, reg, newest[nid], NO_UTILITY, 0.1)
            newest.update({g.node_id: g.epoch for g in grants})
    return table, regs


def test_split_budget_water_fills_then_shares_the_rest_evenly() -> None:
    curves = [[0.9, 0.5], NO_UTILITY, NO_UTILITY]

    assert split_budget(curves, [4, 4, 4], 6) == [4, 1, 1]
    assert split_budget([[0.9, 0.5], [0.8, 0.7, 0.1]], [3, 3], 3) == [1, 2]
    assert split_budget([NO_UTILITY] * 3, [8, 8, 8], 12) == [4, 4, 4]
    assert split_budget([NO_UTILITY] * 2, [2, 3], 12) == [2, 3]


def test_idle_nodes_settle_on_an_even_split_within_the_budget() -> None:
    table, _ = _start(3)

    assert table.committed(0.2) == {"n0": 4, "n1": 4, "n2": 4}
    assert table.pool_committed(0.2) == {"dp": 12}


def test_an_increase_waits_until_the_decrease_it_needs_is_acknowledged() -> None:
    table = LeaseTable(CONFIG, incarnation=1)
    reg0, grants = table.register(_node(0), 0.0)
    assert _latest(grants)["n0"].budget_k == 8
    first = _latest(grants)["n0"].epoch

    reg1, grants = table.register(_node(1), 0.1)
    # n0 is told to shrink to 6, but may still use 8 until it acknowledges: n1 gets only 4.
    assert {g.node_id: g.budget_k for g in grants} == {"n0": 6, "n1": 4}
    assert table.pool_committed(0.1) == {"dp": 12}

    shrink = _latest(grants)["n0"].epoch
    table.report("n0", reg0, first, NO_UTILITY, 0.2)  # acknowledges the old lease only
    assert table.committed(0.2)["n0"] == 8
    table.report("n0", reg0, shrink, NO_UTILITY, 0.3)
    grants = table.report("n1", reg1, _latest(grants)["n1"].epoch, NO_UTILITY, 0.4)
    assert _latest(grants)["n1"].budget_k == 6
    assert table.pool_committed(0.4) == {"dp": 12}


def test_a_silent_nodes_budget_goes_to_the_others_only_after_its_lease_expires() -> None:
    table, regs = _start(3)
    acks = {nid: table.current(nid) for nid in regs}
    now = 0.1
    while now < 0.1 + TTL_S + SLACK_S + 0.6:  # n2 is dead; the others report every 0.25 s
        now += 0.25
        for nid in ("n0", "n1"):
            lease = acks[nid]
            assert lease is not None
            table.report(nid, regs[nid], lease.epoch, NO_UTILITY, now)
            acks[nid] = table.current(nid)
        table.expire(now)
        assert sum(table.pool_committed(now).values()) <= CONFIG.global_budget
        if now < 0.1 + TTL_S:
            assert table.committed(now).get("n2") == 4, now

    assert "n2" not in table.committed(now)
    assert table.committed(now) == {"n0": 6, "n1": 6}


def test_unknown_and_replaced_registrations_are_refused() -> None:
    table = LeaseTable(CONFIG, incarnation=1)
    old, _ = table.register(_node(0), 0.0)
    new, _ = table.register(_node(0), 0.1)

    with pytest.raises(UnknownNodeError, match="not registered"):
        table.report("ghost", 1, 0, NO_UTILITY, 0.2)
    with pytest.raises(StaleRegistrationError, match="replaced"):
        table.report("n0", old, 0, NO_UTILITY, 0.2)
    table.report("n0", new, 0, NO_UTILITY, 0.2)


def test_a_replaced_registration_keeps_its_budget_reserved_until_it_expires() -> None:
    table = LeaseTable(CONFIG, incarnation=1)
    table.register(_node(0), 0.0)  # the old process may still run with 8 tokens
    _, grants = table.register(_node(0), 0.1)

    assert _latest(grants)["n0"].budget_k == 4  # 12 - the orphaned 8
    assert table.pool_committed(0.1) == {"dp": 12}
    assert table.pool_committed(TTL_S + SLACK_S + 0.01) == {"dp": 4}


def test_a_new_incarnation_issues_higher_epochs() -> None:
    before = LeaseTable(CONFIG, incarnation=100)
    after = LeaseTable(CONFIG, incarnation=101)
    _, old = before.register(_node(0), 0.0)
    for _ in range(1000):
        _, old = before.register(_node(0), 0.0)
    _, new = after.register(_node(0), 0.0)

    assert min(g.epoch for g in new) > max(g.epoch for g in old)


def test_deregistered_nodes_free_their_budget_at_once() -> None:
    table, regs = _start(2)
    grants = table.deregister("n1", regs["n1"], 0.2)

    assert [(g.node_id, g.budget_k) for g in grants] == [("n0", 8)]
    assert table.committed(0.2) == {"n0": 8}
    assert table.deregister("ghost", 0, 0.2) == []


OPS = st.lists(
    st.tuples(
        st.sampled_from(["register", "report", "ack", "deregister", "wait"]),
        st.integers(0, 3),  # node
        st.floats(0.0, 1.0),  # utility level / time step
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, budget=st.integers(0, 20))
def test_budget_in_use_never_exceeds_the_pool_budget(
    ops: list[tuple[str, int, float]], budget: int
) -> None:
    """Checked against an independent model of what nodes may use: per registration, the
    largest budget among its leases that are neither expired (issue + TTL + slack) nor older
    than the epoch it acknowledged; a deregistered node uses nothing."""
    config = LeaseConfig(global_budget=budget, ttl_ms=1000, slack_ms=200, report_interval_ms=300)
    life = (config.ttl_ms + config.slack_ms) / 1000
    table = LeaseTable(config, incarnation=7)
    regs: dict[str, int] = {}
    issued: list[tuple[tuple[str, int], int, int, float]] = []  # (node, reg), epoch, k, time
    acked: dict[tuple[str, int], int] = {}
    released: set[tuple[str, int]] = set()
    now = 0.0
    for op, i, x in ops:
        nid = f"n{i}"
        if op == "register":
            regs[nid], grants = table.register(_node(i, k_max=3 + i), now)
        elif op in ("report", "ack") and nid in regs:
            key = (nid, regs[nid])
            ack = max((e for k, e, _, _ in issued if k == key), default=0) if op == "ack" else 0
            curve = [x] * 4
            try:
                grants = table.report(nid, regs[nid], ack, curve, now)
            except UnknownNodeError:
                del regs[nid]
                continue
            acked[key] = max(acked.get(key, 0), ack)
        elif op == "deregister" and nid in regs:
            released.add((nid, regs[nid]))
            grants = table.deregister(nid, regs.pop(nid), now)
        else:
            now += x
            _, grants = table.expire(now)
        for g in grants:
            assert 0 <= g.budget_k <= 3 + int(g.node_id[1:])
            issued.append(((g.node_id, regs[g.node_id]), g.epoch, g.budget_k, now))
        in_use: dict[tuple[str, int], int] = {}
        for key, epoch, k, t in issued:
            if key not in released and now < t + life and epoch >= acked.get(key, 0):
                in_use[key] = max(in_use.get(key, 0), k)
        assert sum(in_use.values()) <= budget
        assert all(total <= budget for total in table.pool_committed(now).values())
