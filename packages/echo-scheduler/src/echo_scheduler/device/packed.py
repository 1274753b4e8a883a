"""Packed pools and the fixed layout: a depth of a pool as a slab, a packed source as a slab
source, a slab selection as a packed one.

:func:`depth_slab` converts one drafted depth of a packed :class:`~echo_core.tree.TreeBatch`
into a :class:`~echo_scheduler.device.layout.DepthSlab` and :func:`packed_keep` maps a
``[B, S]`` selection over the slabs back to the pool's nodes. :class:`PackedSlabs` puts any
packed :class:`~echo_scheduler.driver.DraftSource` (the engine's drafter, the simulator's and
the replay's recorded steps) behind the fixed layout's step loop
(:func:`~echo_scheduler.device.driver.drive_fixed_step`): it grows the pool as ``drive_step``
would (the same plans, so the same drafter calls and the same pool) and hands the policy each
new depth as a slab. A packed drafter sizes its call by the number of nodes to expand, so the
source, not the policy, reads that count once per depth (``front.expand``, boolean indexing);
the policy's part of the step reads nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import ROOT, TreeBatch, empty_tree
from echo_scheduler.device.layout import DepthSlab, Frontier
from echo_scheduler.driver import DraftSource, PolicyClock
from echo_scheduler.interface import DraftPlan
from echo_scheduler.policies.frontier import expand_all


def depth_slab(
    pool: TreeBatch, new: Tensor, width: int, front: tuple[Tensor, Frontier] | None
) -> tuple[DepthSlab, Tensor]:
    """The depth-d nodes ``new`` (global indices into ``pool``, ascending) as a slab, and the
    request-local index of every slot ([B, n_d] int64, -1 where invalid).

    ``front``: the previous depth's slots' local indices and its frontier (None at depth 1,
    where a request's children are its first ``width`` nodes). A node's column is ``f W + w``:
    ``f`` the frontier entry holding its parent, ``w`` its rank among its siblings (they are
    contiguous in the pool). Fixed shape, no host sync."""
    b, dev = pool.batch_size, pool.device
    req = torch.searchsorted(pool.cu_nodes, new, right=True) - 1
    local = new - pool.cu_nodes.index_select(0, req)
    parent = pool.parent.index_select(0, new)
    if front is None:
        entry = torch.zeros_like(new)
        cols = width
    else:
        prev_local, frontier = front
        owners = prev_local.gather(1, frontier.slot)  # [B, F] local index of each entry
        hit = (owners.index_select(0, req) == parent.unsqueeze(1)) & frontier.expand.index_select(
            0, req
        )
        entry = hit.to(torch.int64).argmax(dim=1)
        cols = frontier.slot.shape[1] * width
    sibling = req * (pool.num_nodes + 1) + parent - ROOT  # one id per sibling group
    index = torch.arange(new.numel(), device=dev)
    starts = torch.ones_like(sibling, dtype=torch.bool)
    starts[1:] = sibling[1:] != sibling[:-1]
    rank = index - torch.cummax(torch.where(starts, index, 0), 0).values
    flat = req * cols + entry * width + rank
    path = torch.full((b * cols,), -torch.inf, dtype=torch.float32, device=dev)
    draft = torch.full_like(path, -torch.inf)
    slots = torch.full((b * cols,), -1, dtype=torch.int64, device=dev)
    path.index_copy_(0, flat, pool.path_logprob.index_select(0, new).to(torch.float32))
    draft.index_copy_(0, flat, pool.draft_logprob.index_select(0, new).to(torch.float32))
    slots.index_copy_(0, flat, local)
    slab = DepthSlab(path.view(b, cols), draft.view(b, cols), slots.view(b, cols) >= 0)
    return slab, slots.view(b, cols)


def new_depth_slab(
    grown: TreeBatch, drafted: int, depth: int, width: int, front: tuple[Tensor, Frontier] | None
) -> tuple[DepthSlab, Tensor]:
    """:func:`depth_slab` of the depth-``depth`` nodes ``grown`` added to a pool of ``drafted``
    nodes (they are its only nodes at that depth; their count is a shape, not a read)."""
    added = grown.num_nodes - drafted
    new = torch.nonzero_static(grown.depth == depth, size=added).squeeze(1)
    return depth_slab(grown, new, width, front)


def frontier_nodes(pool: TreeBatch, local: Tensor, front: Frontier) -> Tensor:
    """The global indices in ``pool`` of ``front``'s entries to expand ([M] int64; ``local``:
    the frontier's depth's slots' local indices). Boolean indexing: the one read of a count a
    packed drafter needs per depth, to size its call."""
    owners = local.gather(1, front.slot) + pool.cu_nodes[:-1].unsqueeze(1)
    return owners[front.expand]


def packed_keep(pool: TreeBatch, local: Tensor, keep: Tensor) -> Tensor:
    """``keep`` ([B, S] bool over the slabs side by side) as a mask over ``pool``'s nodes
    ([N] bool); ``local``: every slot's request-local index ([B, S] int64, -1 where invalid).
    One scatter, no host sync."""
    flat = local.reshape(-1)
    where = torch.where(local >= 0, local + pool.cu_nodes[:-1].unsqueeze(1), pool.num_nodes)
    out = torch.zeros(pool.num_nodes + 1, dtype=torch.bool, device=pool.device)
    out.scatter_(0, where.reshape(-1), keep.reshape(-1) & (flat >= 0))
    return out[:-1]


class PackedSlabs:
    """A packed :class:`~echo_scheduler.driver.DraftSource` as a fixed-layout slab source
    (module docstring). After the step, :attr:`pool` holds every drafted node (the pool
    ``drive_step`` would have grown), :meth:`keep` maps the selection onto it, :attr:`depths`
    and :attr:`expansions` count drafter calls and expanded nodes (or roots) as
    ``drive_step`` counts them, and :attr:`clock` holds the time spent converting between the
    layouts (the source's ``grow`` excluded): scheduling work that a packed drafter adds.

    Depth 1 drafts ``width`` children of every root whose cap is above 0 (``caps``: [B] int64,
    the step's ``max_nodes``, on the pool's device); depth d the ``W`` children of every
    frontier entry to expand. Nothing to expand, or a source that can draft nothing more, ends
    the step (:meth:`slab` returns None), as ``drive_step`` ends it: no further depth is folded
    and no gate fires there."""

    gate_empty = True  # an expanded depth that drafts nothing gates every request (the engine's)

    def __init__(self, source: DraftSource, caps: Tensor, width: int) -> None:
        self.source, self.caps, self.width = source, caps, width
        self.pool = empty_tree(int(caps.shape[0]), caps.device)
        self.locals: list[Tensor] = []  # per depth: [B, n_d] local index, -1 where invalid
        self.depths = 0
        self.expansions = 0
        self.clock = PolicyClock()

    def slab(self, depth: int, width: int, front: Frontier | None) -> DepthSlab | None:
        """Depth ``depth``'s slab (the children of ``front``'s entries to expand), or None when
        nothing more is drafted."""
        before = self.pool
        with self.clock.timed(None):
            if front is None:
                plan = DraftPlan.roots(torch.where(self.caps > 0, width, 0))
                prev = None
            else:
                nodes = frontier_nodes(before, self.locals[-1], front)
                plan = expand_all(nodes, self.width)
                prev = (self.locals[-1], front)
            done = plan.done
        if done:
            return None
        grown = self.source.grow(before, plan)
        if grown is None:
            return None
        self.expansions += plan.expansions
        self.depths += 1
        self.pool = grown
        with self.clock.timed(None):
            slab, local = new_depth_slab(grown, before.num_nodes, depth, self.width, prev)
            self.locals.append(local)
        return slab

    def keep(self, keep: Tensor | None) -> Tensor:
        """The selection over :attr:`pool`: ``keep`` ([B, S] bool over the slabs drafted, None
        for a step that drafted nothing) as an [N] bool mask."""
        with self.clock.timed(None):
            if keep is None or not self.locals:
                dev = self.pool.device
                return torch.zeros(self.pool.num_nodes, dtype=torch.bool, device=dev)
            return packed_keep(self.pool, torch.cat(self.locals, dim=1), keep)
