"""The lane mirrors of TorchAttention against the pool gather, over a serving-like history.

A small pool is driven through decode steps with draft trees, commits that keep an accepted path
and free the rest (freed slots come back first: the allocator is a stack), requests that finish
and new ones on their lanes, a prefill of one request, lanes too scattered to mirror, a forward
that fails part-way and a budget too small to mirror. Every forward runs every layer through a
mirrored backend and through ``TorchAttention(mirror_layers=0)`` (K/V gathered from the pool),
and both through the float64 brute force of tests/model/test_attention.py: float32 rounding of
the same sums (:func:`rounding_atol`), while a stale column would be off by O(1).
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import Tensor

from echo_core.tree import make_tree
from echo_core.verify_rows import verify_offsets
from echo_server.kv.slots import SlotAllocator
from echo_server.model.attention import make_batch, tree_row_mask
from echo_server.model.kv_mirror import MirrorConfig, MirrorState, stale_columns
from echo_server.model.torch_attention import DensePlan, GroupedPlan, MirrorPlan, TorchAttention

from .test_attention import DIM, HEADS, KV_HEADS, SCALE, brute_force, rounding_atol

LAYERS, SLOTS, LANES, WIDTH = 3, 400, 12, 96
MIRROR = MirrorConfig(LAYERS, KV_HEADS * DIM * 4, min_context=0)


class History:
    """A pool of ``LAYERS`` layers and the requests on it; :meth:`forward` runs one forward
    through ``backends`` and checks them (module docstring)."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)
        self.k = torch.zeros(LAYERS, SLOTS + 1, KV_HEADS, DIM)
        self.v = torch.zeros(LAYERS, SLOTS + 1, KV_HEADS, DIM)
        self.table = torch.zeros(LANES, WIDTH, dtype=torch.int64)
        self.slots = SlotAllocator(SLOTS)
        self.cache: dict[int, int] = {}  # lane -> cache_len
        self.mirrored = TorchAttention(mirror=MIRROR)
        self.pooled = TorchAttention()
        self.plans: list[object] = []

    def start(self, lane: int) -> None:
        self.cache[lane] = 0

    def finish(self, lane: int) -> None:
        n = self.cache.pop(lane)
        self.slots.free(self.table[lane, :n].clone())
        self.table[lane] = 0

    def forward(
        self,
        lanes: list[int],
        trees: list[list[tuple[int, int, float]]] | None = None,
        rows: list[int] | None = None,
        fail_after: int | None = None,
        accept: list[int] | None = None,
    ) -> None:
        """One forward over ``lanes``: a verify pass with ``trees`` (one per lane), else causal
        ``rows``; then the commit keeps the path to row ``accept[b]`` of each lane (random when
        None; all rows when causal)."""
        mask = None
        if trees is not None:
            tree = make_tree(trees)
            offsets = verify_offsets(tree)
            rows = (offsets[1:] - offsets[:-1]).tolist()
            mask = tree_row_mask(tree)
        assert rows is not None
        write = self.slots.allocate(sum(rows))
        cache = [self.cache[lane] for lane in lanes]
        batch = make_batch(self.table, lanes, cache, rows, write, mask)
        q = torch.randn(sum(rows), HEADS, DIM, generator=self.gen)
        plan = self.mirrored.plan(batch)
        pooled = self.pooled.plan(batch)
        self.plans.append(plan)
        for layer in range(LAYERS):
            k_cache, v_cache = self.k[layer], self.v[layer]
            k_cache[write] = torch.randn(len(write), KV_HEADS, DIM, generator=self.gen)
            v_cache[write] = torch.randn(len(write), KV_HEADS, DIM, generator=self.gen)
            got = self.mirrored.attend(plan, q, q, q, k_cache, v_cache, SCALE)
            if fail_after is not None and layer == fail_after:
                self.slots.free(write)
                return  # the forward raised here: no later layer, no commit
            gathered = self.pooled.attend(pooled, q, q, q, k_cache, v_cache, SCALE)
            want = brute_force(batch, q, k_cache, v_cache, SCALE)
            atol = rounding_atol(batch, want)
            torch.testing.assert_close(got.double(), want, atol=atol, rtol=0)
            torch.testing.assert_close(gathered.double(), want, atol=atol, rtol=0)
        self.commit(lanes, rows, write, mask, accept)

    def commit(
        self,
        lanes: list[int],
        rows: list[int],
        write: Tensor,
        mask: Tensor | None,
        accept: list[int] | None,
    ) -> None:
        """Keep each lane's root and a random root-to-node path (its ancestors per ``mask``);
        free the other rows. Causal rows are all kept."""
        start, dropped = 0, []
        for b, (lane, n) in enumerate(zip(lanes, rows, strict=True)):
            own = write[start : start + n]
            keep = list(range(n))
            if mask is not None and n > 1:
                node = self.rng.randrange(n) if accept is None else accept[b]
                keep = [j for j in range(n) if bool(mask[start + node, j])]
            c = self.cache[lane]
            self.table[lane, c : c + len(keep)] = own[keep]
            self.cache[lane] = c + len(keep)
            dropped += [int(own[j]) for j in range(n) if j not in keep]
            start += n
        if dropped:
            self.slots.free(torch.tensor(dropped, dtype=torch.int64))


CHAIN = [(5, -1, -0.1), (6, 0, -0.2), (7, 1, -0.3)]
BRANCHY = [(5, -1, -0.1), (6, -1, -0.2), (7, 0, -0.3), (8, 2, -0.1)]


def test_mirrors_match_the_pool_gather_over_a_serving_history() -> None:
    h = History(seed=1)
    for lane in (0, 1, 2, 3):
        h.start(lane)
    h.forward([0, 1, 2, 3], rows=[5, 3, 7, 2])  # prefill, lanes in order: no permutation
    for step in range(6):
        trees = [
            CHAIN if (step + b) % 3 == 0 else BRANCHY if (step + b) % 3 == 1 else []
            for b in range(4)
        ]
        h.forward([3, 1, 0, 2], trees=[trees[3], trees[1], trees[0], trees[2]])  # permuted
    assert all(isinstance(p, MirrorPlan) for p in h.plans)
    h.finish(1)
    h.start(1)  # a new request on lane 1, likely on the slots lane 1 just freed
    h.forward([1], rows=[6])
    for _ in range(3):
        h.forward([0, 1, 2, 3], trees=[CHAIN, BRANCHY, [], CHAIN])
    copied = [p.copies.slots.numel() for p in h.plans[-3:] if isinstance(p, MirrorPlan)]
    assert len(copied) == 3
    assert max(copied) <= 4 + 3 + 5 + 1 + 4  # new rows + a moved path


def test_scattered_lanes_are_read_from_the_pool_and_mirrored_again_after() -> None:
    h = History(seed=2)
    lanes = [0, 1, 2, 3, 5, 11]
    for lane in lanes:
        h.start(lane)
    h.forward(lanes, rows=[4, 3, 2, 1, 2, 3])  # 6 gaps for 6 requests: from the pool
    h.forward([0], rows=[1])
    h.forward([5], trees=[BRANCHY])
    h.forward(lanes, trees=[[], [], [], [], BRANCHY, CHAIN])  # roots mirrored, trees pooled
    h.forward([5, 11], rows=[1, 1])  # from the pool
    h.forward([0, 1, 2, 3, 5], rows=[1, 1, 1, 1, 1])  # one gap: mirrored
    h.forward(lanes, trees=[CHAIN, [], BRANCHY, [], CHAIN, []])
    kinds = [type(p) for p in h.plans]
    assert kinds == [
        DensePlan,
        MirrorPlan,
        MirrorPlan,
        MirrorPlan,
        DensePlan,
        MirrorPlan,
        DensePlan,
    ]
    split = h.plans[3]
    assert isinstance(split, MirrorPlan)
    assert split.pooled is not None
    assert [g.plan.batch_size for g in split.lanes] == [4]


def test_a_forward_failing_part_way_is_forgotten() -> None:
    """The failing forward copies, in its first layer only, a draft row the last commit moved
    into the prefix; the next forward must copy it again in every layer."""
    h = History(seed=3)
    for lane in (0, 1, 2):
        h.start(lane)
    h.forward([0, 1, 2], rows=[3, 4, 2])
    h.forward([0, 1, 2], trees=[BRANCHY] * 3, accept=[2, 2, 2])  # root and row 2: row 2 moves
    h.forward([0, 1, 2], trees=[CHAIN, BRANCHY, []], fail_after=0)  # layers 1-2 never ran
    plan = h.plans[-1]
    assert isinstance(plan, MirrorPlan)
    moved = [
        (int(lane), int(col)) for lane, col in zip(plan.copies.lanes, plan.copies.cols, strict=True)
    ]
    assert (0, 4) in moved  # column 4 = cache 3 + path row 1
    flags = [plan.state.in_flight]
    h.forward([0, 1, 2], trees=[BRANCHY, CHAIN, CHAIN])
    flags.append(plan.state.in_flight)
    h.forward([0, 1, 2], rows=[1, 1, 1])
    assert flags == [True, False]


def test_new_rows_read_from_the_pool_are_not_taken_as_mirrored() -> None:
    """A new request on lane 5 gets its lane's old slots back in another order; its prefill is
    read from the pool (lanes too scattered), so the mirror still holds the old request's K/V
    for those slots; one column even holds the same slot id."""
    h = History(seed=8)
    for lane in (0, 5, 11):
        h.start(lane)
    h.forward([5], rows=[3])  # mirrored
    old = h.table[5, :3].tolist()
    h.finish(5)
    h.start(5)
    h.forward([5, 0, 11], rows=[3, 1, 1])  # from the pool
    new = h.table[5, :3].tolist()
    assert sorted(new) == sorted(old)
    assert any(a == b for a, b in zip(old, new, strict=True))
    h.forward([5], rows=[1])  # mirrored: must copy every prefix column
    assert [type(p) for p in h.plans] == [MirrorPlan, DensePlan, MirrorPlan]


def test_over_budget_mirrors_fall_back_to_the_pool() -> None:
    h = History(seed=4)
    h.mirrored = TorchAttention(
        mirror=MirrorConfig(LAYERS, MIRROR.row_bytes, max_bytes=1, min_context=0)
    )
    for lane in (0, 1, 2):
        h.start(lane)
    h.forward([0, 1, 2], rows=[3, 3, 1])
    h.forward([0, 1, 2], trees=[CHAIN, BRANCHY, []])
    h.forward([0, 1, 2], trees=[[], [], BRANCHY])
    assert [type(p) for p in h.plans] == [DensePlan, DensePlan, GroupedPlan]
    assert MIRROR.bytes(16, 256) == 2 * LAYERS * 16 * 256 * KV_HEADS * DIM * 4


def test_each_pool_has_its_own_mirrors() -> None:
    """Two pools through one backend, with equal slot ids on equal lanes."""
    a, b = History(seed=5), History(seed=6)
    b.mirrored = a.mirrored
    for history in (a, b):
        history.start(0)
        history.forward([0], rows=[4])
    a.forward([0], rows=[1])
    b.forward([0], rows=[1])
    assert len(a.mirrored._states) == 2
    del b, history
    a.forward([0], rows=[1])
    assert len(a.mirrored._states) == 1


def test_attend_beyond_the_planned_layers_is_an_error() -> None:
    h = History(seed=7)
    h.start(0)
    h.forward([0], rows=[2])
    plan = h.plans[-1]
    assert isinstance(plan, MirrorPlan)
    q = torch.zeros(2, HEADS, DIM)
    with pytest.raises(RuntimeError, match="3 layers"):
        h.mirrored.attend(plan, q, q, q, h.k[0], h.v[0], SCALE)


def test_stale_columns_worked_example() -> None:
    """Lane 0 (cache 3, 1 new row) last covered 4 columns holding slots 7 8 9 4; now its prefix
    is 7 8 5 (a commit moved slot 5 to column 2) and its new row slot 6: columns 2 and 3 are
    copied. Lane 1 is outside the forward: nothing copied, its coverage kept."""
    table = torch.zeros(2, 8, dtype=torch.int64)
    state = MirrorState.new(table, MIRROR)
    assert state.reserve(2, 4)
    state.held[0, :4] = torch.tensor([7, 8, 9, 4])
    state.valid_upto[:2] = torch.tensor([4, 2])
    kv_index = torch.tensor([[7, 8, 5, 6], [0, 0, 0, 0]])
    copies = stale_columns(
        state, 0, kv_index, torch.tensor([3, 0]), torch.tensor([4, 0]), torch.tensor([True, False])
    )
    assert copies.lanes.tolist() == [0, 0]
    assert copies.cols.tolist() == [2, 3]
    assert copies.slots.tolist() == [5, 6]
    assert state.held[0, :4].tolist() == [7, 8, 5, 6]
    assert state.valid_upto[:2].tolist() == [4, 2]


def test_groups_below_min_context_gather_and_are_caught_up_when_mirrored() -> None:
    """With ``min_context = 8``: the prefill (contexts 3 and 2) and decode steps gather from the
    pool until a verify pass reaches context 8; that pass copies both lanes' whole contexts."""
    h = History(seed=9)
    h.mirrored = TorchAttention(mirror=MirrorConfig(LAYERS, MIRROR.row_bytes, min_context=8))
    for lane in (0, 1):
        h.start(lane)
    h.forward([0, 1], rows=[3, 2])
    h.forward([0, 1], rows=[1, 1])
    h.forward([0, 1], trees=[CHAIN, BRANCHY], accept=[3, 4])  # contexts 4 + 4, 3 + 5: mirrored
    h.forward([0, 1], rows=[1, 1])
    assert [type(p) for p in h.plans] == [DensePlan, DensePlan, MirrorPlan, MirrorPlan]
    first = h.plans[2]
    assert isinstance(first, MirrorPlan)
    assert first.copies.slots.numel() == 4 + 4 + 3 + 5  # every column of both lanes
