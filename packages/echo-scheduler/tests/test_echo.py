"""ECHO's own invariants: gates, Priority 1 before 2, surplus, the floor, and the band shortcuts
pinned to the full ranking."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.testing import HostSyncCounter
from echo_core.tree import TreeBatch
from echo_gating.maps import AcceptanceMaps, DepthMap
from echo_gating.policy import GateMode, GatePolicy
from echo_gating.signals import layer_confidence
from echo_gating.testing import stepped_gate
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import ProfileCost
from echo_scheduler.cut import exact_cut
from echo_scheduler.driver import DrivenStep, drive_step
from echo_scheduler.errors import PolicyError
from echo_scheduler.gating import apply_gate
from echo_scheduler.interface import DraftPlan, RowPrice, StepBatch, StepOutcome
from echo_scheduler.outcome import accepted_lengths
from echo_scheduler.policies.echo import (
    DEPTH,
    EXPLORE_AFTER,
    REINVEST,
    WIDTH,
    EchoPolicy,
    NoLedgerEchoPolicy,
)
from echo_scheduler.policies.frontier import expand_all
from echo_scheduler.ranking import (
    PoolIndex,
    budgeted_select,
    group_order,
    inverse,
    key_order,
    path_score,
    ranks_in_order,
)
from echo_scheduler.simulator import SimSource, drive
from echo_scheduler.workloads import SyntheticStep, SyntheticWorkload

FAST = settings(max_examples=60, deadline=None)
CONFIG = PolicyConfig(max_depth=6, max_width=4)
GATES = st.sampled_from(
    [
        GatePolicy.none(),
        GatePolicy.sparse({2: 0.4, 4: 0.2}, max_depth=6),
        GatePolicy.sparse({1: 0.6}, max_depth=6),
        GatePolicy.dense({1: 0.3, 2: 0.3, 3: 0.2, 4: 0.2, 5: 0.1, 6: 0.1}),
        GatePolicy.fixed(0.25, max_depth=6),
    ]
)


def _step(seed: int, batch: int) -> SyntheticStep:
    return SyntheticWorkload.qwen().sample(batch, 1, torch.Generator().manual_seed(seed))[0]


def _per_request(pool: TreeBatch, mask: torch.Tensor) -> torch.Tensor:
    return torch.bincount(pool.request_index()[mask], minlength=pool.batch_size)


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 8), budget=st.integers(1, 60), gate=GATES)
def test_no_truncated_request_is_widened_while_priority_one_nodes_are_left(
    seed: int, batch: int, budget: int, gate: GatePolicy
) -> None:
    policy = EchoPolicy(CONFIG, gate)
    step = _step(seed, batch)
    run = drive(policy, step, budget)
    tier = policy.tiers(run.pool)
    if bool((run.keep & (tier == WIDTH)).any()):
        held = _per_request(run.pool, run.keep)
        full = (held >= step.max_nodes)[run.pool.request_index()]
        left_behind = (tier == DEPTH) & ~run.keep & ~full
        assert not bool(left_behind.any())


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 8), budget=st.integers(1, 80), gate=GATES)
def test_a_request_that_failed_a_checkpoint_is_never_extended_deeper(
    seed: int, batch: int, budget: int, gate: GatePolicy
) -> None:
    policy = EchoPolicy(CONFIG, gate)
    run = drive(policy, _step(seed, batch), budget)
    t = policy.truncated_at[run.pool.request_index()]
    assert bool((run.pool.depth <= t).all())  # not even drafted deeper
    assert bool((run.pool.depth[run.keep] <= CONFIG.max_depth).all())
    gp = run.pool.global_parent()
    kept_parents = gp[run.keep & (gp >= 0)]
    if kept_parents.numel():
        assert int(torch.bincount(kept_parents).max()) <= CONFIG.draft_width  # width <= Wmax
    for d in sorted(gate.thresholds):
        if gate.mode is GateMode.NONE or d >= CONFIG.max_depth:
            continue
        conf = layer_confidence(run.pool, d)
        reached = torch.bincount(run.pool.request_index()[run.pool.depth > d], minlength=batch)
        # a request with depth > d nodes passed the gate at d
        assert bool((conf[reached > 0] >= gate.thresholds[d]).all())


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 6), gate=GATES)
def test_with_enough_budget_every_gated_band_node_is_selected(
    seed: int, batch: int, gate: GatePolicy
) -> None:
    policy = EchoPolicy(CONFIG, gate)
    step = _step(seed, batch)
    step = step.with_max_nodes(torch.full((batch,), 10_000))
    run = drive(policy, step, budget=10_000)
    tier = policy.tiers(run.pool)
    assert bool(run.keep[tier >= 0].all())  # all eligible nodes: band, width, reinvest
    assert not bool(run.keep[tier < 0].any())


def test_calibrated_maps_rank_the_budget_and_never_favour_a_child() -> None:
    # depth 1 is trusted (score -> high P), depth >= 2 is worth little whatever its score
    maps = AcceptanceMaps(
        (
            DepthMap(edges=(-1.0,), values=(0.2, 0.9), counts=(10, 10)),
            DepthMap(edges=(), values=(0.05,), counts=(20,)),
        )
    )
    gate = GatePolicy(
        version="t", mode=GateMode.NONE, thresholds={}, acceptance_maps=maps, max_depth=2
    )
    policy = EchoPolicy(PolicyConfig(max_depth=4, max_width=3), gate)
    run = drive(policy, _step(12, 4), budget=4)
    key = policy.key(run.pool)
    gp = run.pool.global_parent()
    has = gp >= 0
    assert bool((key[has] <= key[gp[has]]).all())
    assert bool((run.pool.depth[run.keep] == 1).all())  # depth-1 nodes beat all deeper ones


def _gated_maps() -> GatePolicy:
    """``stepped_gate``'s maps behind a sparse checkpoint at depth 1 (``C_b(1) >= 0.5``)."""
    gate = GatePolicy.sparse({1: 0.5}, max_depth=6)
    return dataclasses.replace(gate, acceptance_maps=stepped_gate().acceptance_maps)


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 6), floor=st.floats(0.0, 0.95))
def test_the_cost_floor_keeps_exactly_the_nodes_that_pay_for_their_row(
    seed: int, batch: int, floor: float
) -> None:
    policy = EchoPolicy(PolicyConfig(max_depth=4, max_width=3), stepped_gate())
    step = _step(seed, batch).with_max_nodes(torch.full((batch,), 1000))
    run = drive(policy, step, budget=1000, min_utility=floor)
    if run.pool.num_nodes == 0:
        assert floor >= 0.9  # only skipped when no depth-1 node can reach the floor
        return
    key = policy.key(run.pool)
    assert bool((key[run.keep] >= floor).all())
    assert bool(run.keep[key >= floor].all())  # with budget to spare, every paying node


def test_a_floor_above_every_depth_one_estimate_skips_drafting() -> None:
    policy = EchoPolicy(PolicyConfig(max_depth=4, max_width=3), stepped_gate())
    run = drive(policy, _step(3, 4), budget=100, min_utility=0.95)
    assert run.depths == 0
    assert run.pool.num_nodes == 0
    assert policy.step_modes["floor"] == 1
    run = drive(policy, _step(3, 4), budget=100, min_utility=0.5)
    assert run.depths >= 1
    assert run.pool.num_nodes > 0
    assert policy.step_modes["floor"] == 1


def test_the_depth_price_limits_how_deep_echo_drafts() -> None:
    policy = EchoPolicy(PolicyConfig(max_depth=4, max_width=3), stepped_gate())
    calls = [
        drive(policy, _step(5, 4), budget=100, min_utility=0.01, depth_price=price).depths
        for price in (0.0, 1.0, 1e6)
    ]
    assert calls[0] >= calls[1] >= calls[2] == 0  # no depth promises a million tokens
    assert calls[0] > 1


def test_a_node_price_prunes_expansions_that_cannot_pay_their_drafter_row() -> None:
    policy = EchoPolicy(PolicyConfig(max_depth=4, max_width=3), stepped_gate())
    step = _step(5, 4)

    def run(price: float) -> DrivenStep:
        batch = StepBatch(4, 100, step.max_nodes, min_utility=0.01, node_price=price)
        return drive_step(policy, SimSource(step), batch, strict=True)

    free, mid, dear = run(0.0), run(0.4), run(0.95)
    assert dear.depths == 0  # the best depth-1 estimate, 0.9, is below 0.01 + 0.95
    assert 0 < mid.expansions <= free.expansions
    assert mid.depths <= free.depths


class _FullRanking(EchoPolicy):
    """ECHO decided by the full ranking, the reference of the band shortcuts: every depth looks
    up every key and ranks the whole pool in (tier, key) order, and the plan's depth tier and
    the selection are taken by :func:`budgeted_select` (a node waits for its parent)."""

    def _ranking(
        self, pool: TreeBatch, ix: PoolIndex, key: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """(pos, eligible, tier, group, grouped): the (tier, key desc) priority of every node."""
        eligible = self._eligible(pool.depth, ix.req, key)
        dmax = self.config.max_depth
        group = ix.req * (dmax + 1) + pool.depth.clamp(max=dmax)
        kpos = key_order(key, path_score(pool))
        grouped = group_order(group, kpos)
        band = ranks_in_order(group, grouped, eligible) < self.config.topk
        tier = torch.where(self.truncated[ix.req], WIDTH, REINVEST)
        tier = torch.where(band, DEPTH, tier)
        by_key = inverse(kpos)
        perm = by_key[torch.sort(tier[by_key], stable=True).indices]
        return inverse(perm), eligible, tier, group, grouped

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        d, k0 = self.depth, self.config.topk
        self.truncated_at = apply_gate(self._step_gate, pool, d, self.truncated_at)
        active = self.truncated_at > d
        if self._shallow or d >= self.config.max_depth or not bool(active.any()):
            return DraftPlan.finished(pool.device)
        ix = PoolIndex.of(pool)
        key = self.key(pool)
        pos, eligible, tier, group, grouped = self._ranking(pool, ix, key)
        budget, caps = self.batch.budget, self.batch.max_nodes
        kept = eligible & (tier <= DEPTH)
        held = torch.bincount(ix.req[kept], minlength=pool.batch_size)
        full = int(held.sum()) >= budget
        if full or bool((held > caps).any()):
            kept = budgeted_select(pool, pos, kept, caps, budget, ix)
            held = torch.bincount(ix.req[kept], minlength=pool.batch_size)
            full = int(held.sum()) >= budget
        floor = torch.tensor(self.batch.min_utility, device=pool.device)
        weakest = torch.maximum(key[kept].min(), floor) if full else floor
        if len(ix.by_depth) < d:
            return DraftPlan.finished(pool.device)
        last = ix.by_depth[d - 1]
        bound, guess = self._child_keys(pool, key.index_select(0, last), last, ix.req[last])
        ok = (kept & active[ix.req])[last]
        if full or self.batch.min_utility > 0:
            ok &= bound >= weakest
        # a request holding its cap expands only where a child beats its weakest kept node
        own_least = torch.tensor(
            [float(key[kept & (ix.req == b)].min()) if int(n) else 0.0 for b, n in enumerate(held)]
        )
        at_cap = (held >= caps) & (held > 0)
        own_weakest = torch.where(at_cap, own_least, -torch.inf)[ix.req[last]]
        ok &= bound >= own_weakest
        node_weakest = torch.maximum(weakest, own_weakest)
        if self.batch.node_price:
            ok &= guess - node_weakest > self.batch.node_price
        candidates = torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
        candidates[last] = ok
        nodes = (ranks_in_order(group, grouped, candidates) < k0).nonzero().squeeze(1)
        guess_at = torch.zeros_like(key)
        guess_at[last] = guess - node_weakest
        node_price = self.batch.node_price or 0.0
        gain = float((guess_at[nodes] - node_price).clamp(min=0).double().sum())
        if nodes.numel() == 0 or gain < self._depth_price():
            return DraftPlan.finished(pool.device)
        self._expanded += int(nodes.numel())
        return expand_all(nodes, self.config.draft_width)

    def select(self, pool: TreeBatch) -> torch.Tensor:
        ix = PoolIndex.of(pool)
        key = self.key(pool)
        pos, eligible, *_ = self._ranking(pool, ix, key)
        keep = budgeted_select(pool, pos, eligible, self.batch.max_nodes, self.batch.budget, ix)
        price = self.batch.row_price
        if price is not None and self._step_gate.acceptance_maps is not None:
            keep = exact_cut(key, keep, pool.batch_size, price)
        return keep


@FAST
@given(
    seed=st.integers(0, 10_000),
    batch=st.integers(1, 8),
    budget=st.integers(1, 120),
    floor=st.sampled_from([0.0, 0.1, 0.45]),
    node_price=st.sampled_from([None, 0.05]),
)
def test_the_band_shortcuts_decide_as_the_full_ranking_does(
    seed: int, batch: int, budget: int, floor: float, node_price: float | None
) -> None:
    """Keys grown from the previous depth, ``_next_plan`` deciding from the new depth and the
    carried band, and ``select`` taking the eligible nodes in tier order, whether or not the
    budget (1-120) or a cap binds, must give the full ranking's plans, pool and selection, bit
    for bit, with and without maps, the floor and node prices (three steps, each observed, so
    the ledgers move)."""
    steps = SyntheticWorkload.qwen().sample(batch, 3, torch.Generator().manual_seed(seed))
    for gate in (GatePolicy.sparse({2: 0.4}, max_depth=6), stepped_gate(), _gated_maps()):
        fast, full = EchoPolicy(CONFIG, gate), _FullRanking(CONFIG, gate)
        fast.sync_free = seed % 2 == 0  # the device path or the CPU's shortcut
        for step in steps:
            runs = []
            for policy in (fast, full):
                batch_in = StepBatch(
                    batch, budget, step.max_nodes, min_utility=floor, node_price=node_price,
                    depth_price=0.01,
                )  # fmt: skip
                run = drive_step(policy, SimSource(step), batch_in, strict=True)
                lengths = accepted_lengths(run.pool, run.keep, step.target)
                verified = _per_request(run.pool, run.keep)
                policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
                runs.append(run)
            a, b = runs
            assert a.depths == b.depths
            assert a.expansions == b.expansions
            assert torch.equal(a.pool.token, b.pool.token)
            assert torch.equal(a.pool.cu_nodes, b.pool.cu_nodes)
            assert torch.equal(a.keep, b.keep)


def test_an_exploring_step_drafts_depth_one_and_keeps_its_best_rows_whatever_their_price() -> None:
    # rows priced far above any acceptance: the pre-check skips drafting, the cut keeps nothing
    dear = ProfileCost((1.0, 4.0, 16.0, 64.0), (0.01, 0.04, 0.16, 0.64))
    policy = EchoPolicy(PolicyConfig(max_depth=4, max_width=3), stepped_gate())
    step = _step(3, 2)

    def run(explore: int) -> DrivenStep:
        batch = StepBatch(
            step.batch_size,
            100,
            step.max_nodes,
            min_utility=0.99,
            row_price=RowPrice(1000.0, dear),
            explore_rows=explore,
        )
        return drive_step(policy, SimSource(step), batch, strict=True)

    plain = [run(0) for _ in range(2 * EXPLORE_AFTER)]  # nothing untimed: never explores
    assert all(r.pool.num_nodes == 0 for r in plain)
    assert policy.step_modes["floor"] == 2 * EXPLORE_AFTER
    refused = [run(2) for _ in range(EXPLORE_AFTER)]  # refusals in a row first (one counted)
    assert all(r.pool.num_nodes == 0 for r in refused[1:])
    explored = refused[0] if refused[0].pool.num_nodes else run(2)
    assert explored.depths == 1
    assert policy.step_modes["explore"] == 1
    assert int(explored.keep.sum()) == 2
    key = policy.key(explored.pool)
    assert float(key[explored.keep].min()) >= float(key[~explored.keep].max())  # the best two
    assert bool((explored.pool.depth[explored.keep] == 1).all())
    assert run(2).pool.num_nodes == 0  # refusals counted afresh after an exploration


def test_a_step_drafting_many_rows_explores_the_untimed_few() -> None:
    # rows nearly free: ECHO drafts deep and verifies many; two untimed row counts above B
    free = ProfileCost((1.0, 4.0, 16.0, 64.0), (0.01, 0.01, 0.0101, 0.0102))
    policy = NoLedgerEchoPolicy(PolicyConfig(max_depth=4, max_width=3), stepped_gate())
    step = _step(5, 3)

    def run(explore: int) -> DrivenStep:
        batch = StepBatch(
            step.batch_size, 100, step.max_nodes, min_utility=0.01, depth_price=0.01,
            row_price=RowPrice(1.0, free), explore_rows=explore,
        )  # fmt: skip
        return drive_step(policy, SimSource(step), batch, strict=True)

    timed = [run(0) for _ in range(2 * EXPLORE_AFTER)]  # nothing untimed: never explores
    assert all(int(r.keep.sum()) > 2 for r in timed)
    assert policy.step_modes["explore"] == 0
    drafted = [run(2) for _ in range(EXPLORE_AFTER)]  # drafted steps in a row first
    assert all(int(r.keep.sum()) > 2 for r in drafted)
    explored = run(2)
    assert policy.step_modes["explore"] == 1
    assert explored.depths == 1
    assert int(explored.keep.sum()) == 2  # exactly the two best, though more would pay
    key = policy.key(explored.pool)
    assert float(key[explored.keep].min()) >= float(key[~explored.keep].max())
    assert int(run(2).keep.sum()) > 2  # counted afresh after an exploration


def test_explore_rows_must_be_a_count() -> None:
    with pytest.raises(PolicyError, match="explore_rows"):
        StepBatch(2, 4, torch.zeros(2, dtype=torch.int64), explore_rows=-1)


class _CountedSelect(EchoPolicy):
    """ECHO recording the host syncs of each ``select`` call."""

    sync_free = True  # the device path, here on the CPU

    def __init__(self, config: PolicyConfig, gate: GatePolicy) -> None:
        super().__init__(config, gate)
        self.syncs: list[int] = []

    def select(self, pool: TreeBatch) -> torch.Tensor:
        with HostSyncCounter() as syncs:
            keep = super().select(pool)
        self.syncs.append(syncs.total)
        return keep


@pytest.mark.parametrize("budget", [8, 400])
def test_the_selection_and_its_cut_make_no_host_sync(budget: int) -> None:
    """Issue #44: ``select`` (tiers, caps, budget, the exact cut) on a pool ECHO drafted is
    fixed-shape tensor work whether the budget binds (8) or not (400), at every batch size, also
    where drafting stopped before the last depth's band was extended (its nodes are the ones the
    previous depth's pool lacked: a count known on the host)."""
    price = RowPrice(40.0, ProfileCost((1.0, 64.0, 512.0), (0.010, 0.012, 0.040)))
    for batch in (1, 16, 64):
        steps = SyntheticWorkload.qwen().sample(batch, 2, torch.Generator().manual_seed(batch))
        for gate in (GatePolicy.none(), _gated_maps()):
            policy = _CountedSelect(CONFIG, gate)
            for step in steps:
                batch_in = StepBatch(
                    batch, budget, step.max_nodes, min_utility=0.05, depth_price=0.01,
                    row_price=price,
                )  # fmt: skip
                assert drive_step(policy, SimSource(step), batch_in, strict=True).depths >= 1
            assert policy.syncs == [0] * len(steps), (batch, gate.mode, policy.syncs)


@FAST
@given(
    seed=st.integers(0, 10_000),
    budget=st.integers(1, 24),
    floor=st.sampled_from([0.0, 0.1]),
    node_price=st.sampled_from([None, 0.05]),
)
def test_a_cap_equal_to_the_budget_decides_as_the_budget_alone_at_batch_one(
    seed: int, budget: int, floor: float, node_price: float | None
) -> None:
    """One request, its cap ``K``: the cap is the budget, so ECHO drafts the same depths and
    nodes and selects the same rows as with K alone. (SGLang caps each request at N - 1 nodes;
    before 2026-12-06 a request at its cap stopped drafting while a full budget did not, which
    kept unlikely depth-1 siblings instead of deeper drafts.)"""
    step = _step(seed, 1)
    for gate in (GatePolicy.none(), stepped_gate(), _gated_maps()):
        runs = []
        for cap in (budget, 1 << 30):
            policy = EchoPolicy(CONFIG, gate)
            batch_in = StepBatch(
                1, budget, torch.tensor([cap]), min_utility=floor, node_price=node_price,
                depth_price=0.01,
            )  # fmt: skip
            runs.append(drive_step(policy, SimSource(step), batch_in, strict=True))
        capped, free = runs
        assert capped.depths == free.depths
        assert capped.expansions == free.expansions
        assert torch.equal(capped.pool.token, free.pool.token)
        assert torch.equal(capped.keep, free.keep)
