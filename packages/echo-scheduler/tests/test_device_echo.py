"""Issue #44: ECHO's decisions in the fixed layout (echo_scheduler.device) decide as ``echo``
does, plan for plan and node for node, with no host sync inside the fixed step."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.testing import HostSyncCounter, OpTrace
from echo_core.tree import TreeBatch, empty_tree, make_tree, select_nodes
from echo_gating.policy import GatePolicy
from echo_gating.signals import layer_confidence, sibling_margin
from echo_gating.testing import stepped_gate
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import ProfileCost, VerifyCostModel
from echo_scheduler.device import DepthSlab, FixedEchoStep, Frontier, StepPrices, StepScalars
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.device.driver import drive, drive_fixed_step
from echo_scheduler.device.echo_step import budget_bucket, first_in_rows, layout_rows
from echo_scheduler.device.layout import INT64_MIN, first_by_key, row_band, tiered_key
from echo_scheduler.device.layout import layer_confidence as slab_confidence
from echo_scheduler.device.layout import sibling_margin as slab_margin
from echo_scheduler.device.packed import depth_slab
from echo_scheduler.driver import drive_step
from echo_scheduler.interface import DraftPlan, RowPrice, StepBatch, StepOutcome
from echo_scheduler.outcome import accepted_lengths
from echo_scheduler.policies import make_policy
from echo_scheduler.policies.echo import EchoPolicy
from echo_scheduler.policies.frontier import expand_all
from echo_scheduler.ranking import composite_key, first_in_order
from echo_scheduler.simulator import SimSource
from echo_scheduler.workloads import SyntheticStep, SyntheticWorkload

FAST = settings(max_examples=40, deadline=None)
CONFIG = PolicyConfig(max_depth=6, max_width=4)
PRICE = RowPrice(40.0, ProfileCost((1.0, 8.0, 64.0, 512.0), (0.010, 0.0104, 0.012, 0.040)))
STEEP = ProfileCost((1.0, 16.0, 128.0), (0.010, 0.030, 0.5))
HINGE = VerifyCostModel(0.010, 0.0, 0.002, 24.0)


def _gated_maps(signal: str = "layer_confidence") -> GatePolicy:
    gate = GatePolicy.sparse({1: 0.5, 3: 0.3}, max_depth=6)
    return dataclasses.replace(gate, acceptance_maps=stepped_gate().acceptance_maps, signal=signal)


GATES = (
    GatePolicy.none(),
    GatePolicy.sparse({2: 0.4}, max_depth=6),
    stepped_gate(),
    _gated_maps(),
    _gated_maps("sibling_margin"),
)


def _per_request(pool: TreeBatch, mask: torch.Tensor) -> torch.Tensor:
    return torch.bincount(pool.request_index()[mask], minlength=pool.batch_size)


@FAST
@given(
    seed=st.integers(0, 10_000),
    batch=st.integers(1, 8),
    budget=st.integers(1, 120),
    floor=st.sampled_from([0.0, 0.1, 0.45]),
    node_price=st.sampled_from([None, 0.05]),
    priced=st.booleans(),
    explore=st.sampled_from([0, 3]),
)
def test_the_fixed_layout_plans_and_selects_as_echo_does(
    seed: int,
    batch: int,
    budget: int,
    floor: float,
    node_price: float | None,
    priced: bool,
    explore: int,
) -> None:
    """Every gate (with and without maps, both gate signals), budgets that bind or not, caps,
    floors, node prices, the exact cut and exploration: the same depths, expansions, pools and
    selections as ``echo``, step after step (each observed, so ledgers and the mode chooser
    move alike)."""
    steps = SyntheticWorkload.qwen().sample(batch, 6, torch.Generator().manual_seed(seed))
    for gate in GATES:
        ref, dev, fixed = (cls(CONFIG, gate) for cls in (EchoPolicy, DeviceEchoPolicy,
                                                         DeviceEchoPolicy))  # fmt: skip
        # echo on the packed loop; echo_device behind it (the adapter) and in its own fixed
        # loop over the same packed source (echo_scheduler.device.driver.drive)
        for step in steps:
            runs = []
            for policy, loop in ((ref, drive_step), (dev, drive_step), (fixed, drive)):
                batch_in = StepBatch(
                    batch, budget, step.max_nodes, min_utility=floor, node_price=node_price,
                    depth_price=0.01, row_price=PRICE if priced else None, explore_rows=explore,
                )  # fmt: skip
                run = loop(policy, SimSource(step), batch_in, strict=True)
                lengths = accepted_lengths(run.pool, run.keep, step.target)
                verified = _per_request(run.pool, run.keep)
                policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
                runs.append(run)
            a = runs[0]
            for b in runs[1:]:
                assert a.depths == b.depths, gate
                assert a.expansions == b.expansions
                assert torch.equal(a.pool.token, b.pool.token)
                assert torch.equal(a.pool.cu_nodes, b.pool.cu_nodes)
                assert torch.equal(a.keep, b.keep), gate
        assert ref.step_modes == dev.step_modes == fixed.step_modes
        assert ref.ledger is not None
        assert fixed.ledger is not None
        assert ref.ledger.summary() == fixed.ledger.summary()  # the same drafter calls, nodes


@pytest.mark.parametrize("max_depth", [1, 2, 3])
def test_a_driver_depth_bound_below_the_policys_keeps_the_ledger_equal(max_depth: int) -> None:
    """``drive`` with ``max_depth`` below ``config.max_depth`` (the engine's ``--max-depth``):
    the same selections and the same ledger as ``echo`` under ``drive_step``, whose last plan
    counts the nodes it would still expand."""
    steps = SyntheticWorkload.qwen().sample(6, 6, torch.Generator().manual_seed(max_depth))
    ref, dev = EchoPolicy(CONFIG, _gated_maps()), DeviceEchoPolicy(CONFIG, _gated_maps())
    for step in steps:
        keeps = []
        for policy, loop in ((ref, drive_step), (dev, drive)):
            sb = StepBatch(6, 40, step.max_nodes, 0.02, row_price=PRICE, node_price=0.01)
            run = loop(policy, SimSource(step), sb, max_depth=max_depth)
            lengths = accepted_lengths(run.pool, run.keep, step.target)
            verified = _per_request(run.pool, run.keep)
            policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
            keeps.append(run.keep)
        assert torch.equal(*keeps)
    assert ref.ledger is not None
    assert dev.ledger is not None
    assert ref.ledger.summary() == dev.ledger.summary()


def test_echo_device_is_registered_and_offered() -> None:
    policy = make_policy("echo_device", CONFIG, gate=stepped_gate())
    assert isinstance(policy, DeviceEchoPolicy)
    assert policy.name == "echo_device"


def _slabs(batch: int, seed: int) -> tuple[DeviceEchoPolicy, StepBatch, list[DepthSlab]]:
    """A step ``echo_device`` drafted on a synthetic step, and the slabs it saw."""
    step = SyntheticWorkload.qwen().sample(batch, 1, torch.Generator().manual_seed(seed))[0]
    policy = DeviceEchoPolicy(CONFIG, _gated_maps())
    batch_in = StepBatch(batch, 4 * batch, step.max_nodes, min_utility=0.05, row_price=PRICE)
    drive_step(policy, SimSource(step), batch_in, strict=True)
    assert policy.fixed is not None
    return policy, batch_in, list(policy.fixed.slabs)


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_the_fixed_step_makes_no_host_sync(batch: int) -> None:
    """After every depth and at the selection, whatever the batch: zero reads of the device."""
    policy, batch_in, slabs = _slabs(batch, batch)
    assert len(slabs) >= 2
    prices = StepPrices(
        batch_in.budget, batch_in.max_nodes, min_utility=0.05, depth_price=0.0, row_price=PRICE
    )
    fixed = FixedEchoStep(CONFIG, _gated_maps(), prices)
    with HostSyncCounter() as syncs:
        for i, slab in enumerate(slabs):
            fixed.fold_depth(slab, last=i == len(slabs) - 1)
        keep = fixed.select()
    assert syncs.total == 0, dict(syncs.sites)
    assert policy.fixed is not None
    assert torch.equal(keep, policy.fixed.select())


@pytest.mark.parametrize("batch", [1, 16, 64, 256])
def test_the_policy_part_of_a_fixed_loop_step_reads_at_most_one_value(batch: int) -> None:
    """Driven in its own loop (``drive``, a packed source behind PackedSlabs), ``echo_device``'s
    calls inside a step (begin, every depth, the selection) read one value, the live count of
    the caps (a host tensor in the plugin), at every B and depth; the packed source reads its
    own counts outside them, and ``observe`` reads the step's counters after verification."""
    steps = SyntheticWorkload.qwen().sample(batch, 3, torch.Generator().manual_seed(batch))
    policy = DeviceEchoPolicy(CONFIG, _gated_maps())
    maps = policy.gate.acceptance_maps
    assert maps is not None
    policy._best_first(maps, torch.device("cpu"))  # read once per set of maps, not per step
    inside = HostSyncCounter()
    depths = 0
    for step in steps:
        batch_in = StepBatch(batch, 4 * batch, step.max_nodes, min_utility=0.05, row_price=PRICE)
        run = drive(policy, SimSource(step), batch_in, strict=True, around=lambda: inside)
        depths = max(depths, run.depths)
        lengths = accepted_lengths(run.pool, run.keep, step.target)
        verified = _per_request(run.pool, run.keep)
        policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
    assert depths >= 2
    assert inside.total <= len(steps), dict(inside.sites)


def _run_fixed(
    slabs: list[DepthSlab], prices: StepPrices, scalars: StepScalars
) -> tuple[torch.Tensor, list[tuple[str, object]]]:
    """The fixed step over ``slabs`` reading ``scalars``: its selection and its aten ops."""
    with OpTrace() as trace:
        fixed = FixedEchoStep(CONFIG, _gated_maps(), prices, scalars)
        for i, slab in enumerate(slabs):
            fixed.fold_depth(slab, last=i == len(slabs) - 1)
        keep = fixed.select()
    return keep, trace.ops


def test_one_op_sequence_serves_every_price() -> None:
    """The step's ops, with their shapes and constants, do not depend on any price beyond the
    budget's bucket (budget_bucket: the top-k sizes), nor on the latency model that prices the
    rows (a profile with other points, a hinge): what a CUDA graph records for one step replays
    another of the same shapes and bucket once the scalars buffers are reloaded (K = 40 and 64
    share one), and it selects what a step built for those prices selects."""
    _, batch_in, slabs = _slabs(16, 3)
    caps = batch_in.max_nodes
    variants = [
        StepPrices(budget, caps, u_min, node, depth, price)
        for budget, u_min, node, depth, price in [
            (64, 0.05, 0.0, 0.0, PRICE),
            (3, 0.0, 0.0, 0.0, PRICE),
            (500, 0.3, 0.05, 0.5, dataclasses.replace(PRICE, rate=5.0, scale=0.5)),
            (40, 0.0, 0.02, 0.01, dataclasses.replace(PRICE, rate=400.0)),
            (500, 0.0, 0.0, 0.0, dataclasses.replace(PRICE, rate=200.0)),
            (500, 0.0, 0.0, 0.0, dataclasses.replace(PRICE, rate=200.0, latency=STEEP)),
            (500, 0.0, 0.0, 0.0, dataclasses.replace(PRICE, rate=200.0, latency=HINGE)),
        ]
    ]
    rows = layout_rows(CONFIG, int(caps.shape[0]))
    shared = StepScalars.of(variants[0], caps.device, rows)  # one set, as a graph holds
    traces: dict[int, list[list[tuple[str, object]]]] = {}
    selections = []
    for prices in variants:
        shared.load(prices)
        keep, ops = _run_fixed(slabs, prices, shared)
        fresh = FixedEchoStep(CONFIG, _gated_maps(), prices)
        for i, slab in enumerate(slabs):
            fresh.fold_depth(slab, last=i == len(slabs) - 1)
        assert torch.equal(keep, fresh.select())
        traces.setdefault(budget_bucket(prices.budget), []).append(ops)
        selections.append(keep)
    assert sorted(traces) == [4, 64, 512]
    for same_bucket in traces.values():
        assert all(o == same_bucket[0] for o in same_bucket[1:])
    assert len({tuple(k.reshape(-1).tolist()) for k in selections}) > 1  # the prices mattered
    assert len({int(k.sum()) for k in selections[-3:]}) == 3  # and so did the latency models


def test_row_band_compacts_the_first_masked_columns_in_order() -> None:
    mask = torch.tensor([[False, True, True, False, True], [False] * 5, [True] * 5])
    order = torch.zeros(3, 5, dtype=torch.float64)  # all tied: the lower columns first
    band, slot, ok = row_band(order, mask, 3)
    assert slot.tolist() == [[1, 2, 4], [0, 0, 0], [0, 1, 2]]
    assert ok.tolist() == [[True] * 3, [False] * 3, [True] * 3]
    assert band.tolist() == [
        [False, True, True, False, True],
        [False] * 5,
        [True] * 3 + [False] * 2,
    ]
    band, slot, ok = row_band(order[:, :2], mask[:, :2], 3)  # fewer columns than the width
    assert slot.tolist() == [[1, 0, 0], [0, 0, 0], [0, 1, 0]]
    assert ok.tolist() == [[True, False, False], [False] * 3, [True, True, False]]


@FAST
@given(st.integers(1, 5), st.integers(1, 9), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_row_band_takes_each_rows_best_masked_columns(
    b: int, n: int, width: int, seed: int
) -> None:
    """Against Python's sort of each row's masked columns by (order desc., column asc.), with
    composite keys that tie in their key, differ only in the 2^-30 tie-break, or tie exactly."""
    gen = torch.Generator().manual_seed(seed)
    key = torch.randint(0, 4, (b, n), generator=gen).double() / 4
    order = composite_key(key, torch.randint(0, 3, (b, n), generator=gen).double() / 2)
    mask = torch.rand(b, n, generator=gen) < 0.7
    band, slot, ok = row_band(order, mask, width)
    for r in range(b):
        cols = sorted((c for c in range(n) if mask[r, c]), key=lambda c: (-float(order[r, c]), c))
        best = sorted(cols[:width])
        assert band[r].nonzero().flatten().tolist() == best
        assert slot[r].tolist() == best + [0] * (width - len(best))
        assert ok[r].tolist() == [True] * len(best) + [False] * (width - len(best))


@FAST
@given(
    st.integers(1, 4), st.integers(1, 40), st.integers(0, 2**31 - 1), st.integers(0, 45),
    st.integers(0, 8),
)  # fmt: skip
def test_first_by_key_takes_the_first_count_by_key_then_position(
    b: int, n: int, seed: int, count: int, slack: int
) -> None:
    """Both ways (a stable rank; a top-``limit`` threshold where the limit is at most half the
    row) against Python's sort by (key desc., position asc.), with many exact ties, keys at
    INT64_MIN among the masked ones, per-row counts and limits from the count up."""
    gen = torch.Generator().manual_seed(seed)
    key = torch.randint(-2, 3, (b, n), generator=gen) * (1 << 61)
    key = torch.where(key == -2 * (1 << 61), INT64_MIN, key)
    mask = torch.rand(b, n, generator=gen) < 0.7
    counts = torch.randint(0, count + 1, (b,), generator=gen)
    for limit in (None, count + slack):
        got = first_by_key(key, mask, counts, limit)
        for r in range(b):
            cols = sorted((c for c in range(n) if mask[r, c]), key=lambda c: (-int(key[r, c]), c))
            assert got[r].nonzero().flatten().tolist() == sorted(cols[: int(counts[r])])
        flat = first_by_key(key.reshape(-1), mask.reshape(-1), torch.tensor(count), limit)
        every = sorted((i for i in range(b * n) if mask.reshape(-1)[i]),
                       key=lambda i: (-int(key.reshape(-1)[i]), i))  # fmt: skip
        assert flat.nonzero().flatten().tolist() == sorted(every[:count])


def _lexicographic(order: torch.Tensor, tier: torch.Tensor) -> torch.Tensor:
    """Positions by (tier asc., order desc., flat index asc.) from Python's own sort."""
    rows = sorted(
        range(order.numel()),
        key=lambda i: (int(tier.reshape(-1)[i]), -float(order.reshape(-1)[i]), i),
    )
    pos = torch.empty(order.numel(), dtype=torch.int64)
    pos[torch.tensor(rows)] = torch.arange(order.numel())
    return pos


@FAST
@given(
    st.integers(1, 6), st.integers(1, 9), st.integers(0, 2**31 - 1), st.integers(0, 40),
)  # fmt: skip
def test_first_in_rows_takes_what_first_in_order_takes(
    b: int, n: int, seed: int, budget: int
) -> None:
    """The fixed layout's ranking (one int64 key, two sorts) against the packed one
    (first_in_order on Python's lexicographic positions), with composite keys that tie in
    their key and differ only in the 2^-30 tie-break, and with exact ties."""
    gen = torch.Generator().manual_seed(seed)
    key = torch.randint(0, 4, (b, n), generator=gen).double() / 4  # coarse: ties
    tiebreak = torch.randint(0, 3, (b, n), generator=gen).double() / 2
    order = composite_key(key, tiebreak)
    tier = torch.randint(0, 3, (b, n), generator=gen)
    mask = torch.rand(b, n, generator=gen) < 0.8
    tier = torch.where(mask, tier, 3)  # an ineligible slot's tier
    caps = torch.randint(0, n + 1, (b,), generator=gen)
    got = first_in_rows(order, mask, caps, torch.tensor(budget), tier)
    group = torch.arange(b).repeat_interleave(n)
    want = first_in_order(_lexicographic(order, tier), group, caps, budget, mask.reshape(-1))
    assert torch.equal(got.reshape(-1), want)
    bounded = first_in_rows(order, mask, caps, budget, tier, limit=budget_bucket(budget))
    assert torch.equal(bounded.reshape(-1), want)  # a top-k of the bucket's size, not a sort
    untiered = first_in_rows(order, mask, caps, budget)
    flat = _lexicographic(order, torch.zeros_like(tier))
    assert torch.equal(
        untiered.reshape(-1), first_in_order(flat, group, caps, budget, mask.reshape(-1))
    )


def test_a_tiered_key_keeps_the_tie_break_a_float_offset_would_round_away() -> None:
    low = composite_key(torch.tensor([0.25, 0.25]), torch.tensor([0.0, 2.0**-23]))
    assert low[1] > low[0]
    assert (low - 2.0)[1] == (low - 2.0)[0]  # the float offset rounds the tie-break away
    key = tiered_key(low.repeat(3), torch.tensor([0, 0, 1, 1, 2, 2]))
    assert key.argsort(descending=True, stable=True).tolist() == [1, 0, 3, 2, 5, 4]
    zeros = tiered_key(torch.tensor([-0.0, 0.0]))
    assert int(zeros[0]) == int(zeros[1]) == 0


@pytest.mark.parametrize("seed", range(6))
def test_the_gate_signals_in_the_fixed_layout_equal_the_packed_ones(seed: int) -> None:
    step = SyntheticWorkload.qwen().sample(5, 1, torch.Generator().manual_seed(seed))[0]
    policy = DeviceEchoPolicy(CONFIG, GatePolicy.none())
    batch_in = StepBatch(5, 200, step.max_nodes)
    run = drive_step(policy, SimSource(step), batch_in, strict=True)
    assert policy.fixed is not None
    for d, slab in enumerate(policy.fixed.slabs, start=1):
        torch.testing.assert_close(slab_confidence(slab), layer_confidence(run.pool, d))
        width = CONFIG.draft_width
        torch.testing.assert_close(slab_margin(slab, width), sibling_margin(run.pool, d))


def test_a_slab_puts_each_child_under_its_frontier_entry() -> None:
    """Two requests; request 0 expands entries 0 and 2 of its frontier, request 1 none: the
    children land in columns ``f W + w`` and nowhere else."""
    pool = make_tree(
        [
            [(1, -1, -0.1), (2, -1, -0.2), (3, -1, -0.3), (4, 0, -0.4), (5, 2, -0.5), (6, 2, -0.6)],
            [(7, -1, -0.7)],
        ]
    )
    prev_local = torch.tensor([[0, 1, 2], [0, -1, -1]])
    expand = torch.tensor([[True, False, True], [False, False, False]])
    front = Frontier(torch.tensor([[0, 1, 2], [0, 0, 0]]), expand)
    slab, local = depth_slab(pool, torch.tensor([3, 4, 5]), 2, (prev_local, front))
    assert local.tolist() == [[3, -1, -1, -1, 4, 5], [-1] * 6]
    assert slab.valid.tolist() == [[True, False, False, False, True, True], [False] * 6]


class _EveryDepth:
    """A slab source that drafts ``max_depth`` depths whatever it is asked (the recorded step's
    children of the entries to expand; nothing where no entry is expanded): the shape of a
    device drafter that runs a fixed number of depths."""

    gate_empty = True

    def __init__(self, step: SyntheticStep, batch: int) -> None:
        self.source = SimSource(step)
        self.pool = empty_tree(batch)
        self.locals: list[torch.Tensor] = []

    def slab(self, depth: int, width: int, front: Frontier | None) -> DepthSlab:
        before = self.pool
        if front is None:
            roots = torch.full((before.batch_size,), width, dtype=torch.int64)
            plan = DraftPlan.roots(roots)
            prev = None
        else:
            local = self.locals[-1].gather(1, front.slot) + before.cu_nodes[:-1].unsqueeze(1)
            plan = expand_all(local[front.expand], CONFIG.draft_width)
            prev = (self.locals[-1], front)
        self.pool = self.source.grow(before, plan) if not plan.done else before
        added = self.pool.num_nodes - before.num_nodes
        new = torch.nonzero_static(self.pool.depth == depth, size=added).squeeze(1)
        slab, local = depth_slab(self.pool, new, CONFIG.draft_width, prev)
        self.locals.append(local)
        return slab


@FAST
@given(seed=st.integers(0, 10_000), batch=st.integers(1, 6), budget=st.integers(1, 60))
def test_a_drafter_of_every_depth_selects_what_echo_selects(
    seed: int, batch: int, budget: int
) -> None:
    """Depths drafted after ECHO stopped (all slots invalid) change nothing: no gate fires
    there, and the selection maps to ``echo``'s on the same step."""
    steps = SyntheticWorkload.qwen().sample(batch, 3, torch.Generator().manual_seed(seed))
    for gate in GATES[1:]:
        ref, dev = EchoPolicy(CONFIG, gate), DeviceEchoPolicy(CONFIG, gate)
        for step in steps:
            sb = StepBatch(batch, budget, step.max_nodes, min_utility=0.05, depth_price=0.01)
            run = drive_step(ref, SimSource(step), sb, strict=True)
            source = _EveryDepth(step, batch)
            driven = drive_fixed_step(dev, source, sb, CONFIG.max_depth, torch.device("cpu"))
            keep = torch.zeros(source.pool.num_nodes, dtype=torch.bool)
            if driven.keep is not None:
                local = torch.cat(source.locals, dim=1)
                glob = local + source.pool.cu_nodes[:-1].unsqueeze(1)
                keep[glob[driven.keep & (local >= 0)]] = True
            ours = select_nodes(source.pool, keep)
            theirs = select_nodes(run.pool, run.keep)
            assert torch.equal(ours.token, theirs.token), gate.mode
            assert torch.equal(ours.cu_nodes, theirs.cu_nodes), gate.mode
            lengths = accepted_lengths(run.pool, run.keep, step.target)
            verified = _per_request(run.pool, run.keep)
            for policy in (ref, dev):
                policy.observe(StepOutcome(accepted_lengths=lengths, verified=verified))
            assert dev.depth == run.depths  # the drafter calls the ledger records
