"""Tensor primitives every policy selects with: orders, per-group ranks, budgeted selection.

The central one is :func:`budgeted_select`: given a strict priority order over the pool's nodes,
take nodes in that order while (a) the node's request has taken fewer than ``cap[b]`` nodes and
(b) fewer than ``budget`` nodes are taken in total, where a node becomes available only once its
parent is taken: the sequential rule "repeatedly take the best-positioned node whose parent is
taken" (tested against it). Vectorised: a node's *effective position* is the latest position on
its root path, ``eff_i = max(pos_i, eff_parent(i))`` (one pass per depth). If ``eff == pos`` for
every eligible node, ``pos`` already lists ancestors first and is the rule's order; otherwise
:func:`greedy_order` sorts by each path's record sequence (ties in ``eff`` are broken the way
the rule breaks them, recursively below the tied ancestor). Any prefix of that order, filtered
by per-request prefix caps, is ancestor-closed. Worked example: a chain a -> b with positions
``pos = [5, 1]`` has ``eff = [5, 5]``; b is deferred until right after a, and with budget 1
only a is kept.

With a key that never increases from parent to child (a path score, or any key passed through
:func:`monotone_key`) and ties broken by index, plain key order already lists ancestors first, so
per-request top-n and global top-K by key are ancestor-closed on their own.

Cost: sorts dominate on the CPU (about 0.3-0.6 ms for 8k nodes on the dev machine). ECHO's hot
path sorts only a depth's new nodes (:func:`key_order` and :func:`group_order` once each), plus,
when the budget or a cap binds, its band once more (:func:`first_in_order`); ranks under any mask
come from :func:`ranks_in_order` in O(N), and :func:`budgeted_select` (the full ranking: the
reference ECHO's shortcuts are tested against, and ECHO's selection on a pool it did not draft)
skips its own sorts when the priority is already ancestor-consistent and no cap binds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_scheduler.errors import PolicyError

UNRANKED = 1 << 40
"""Rank sentinel of elements outside a mask (larger than any pool)."""

TIE_WEIGHT = 2.0**-30
"""Weight of the tiebreak in :func:`key_order`'s composite (keys and tiebreaks lie in [0, 1])."""


@dataclass(frozen=True, slots=True)
class PoolIndex:
    """Per-pool index tensors, computed once per call and shared by the primitives."""

    req: Tensor  # [N] int64, request of every node
    gp: Tensor  # [N] int64, global parent index, -1 for root children
    by_depth: tuple[Tensor, ...]  # global indices of the nodes at depth 1, 2, ...
    batch_size: int

    @staticmethod
    def of(pool: TreeBatch) -> PoolIndex:
        req = pool.request_index()
        gp = torch.where(pool.parent >= 0, pool.parent + pool.cu_nodes[:-1][req], pool.parent)
        groups: tuple[Tensor, ...] = ()
        if pool.num_nodes:
            order = torch.argsort(pool.depth, stable=True)
            counts = torch.bincount(pool.depth - 1)
            groups = tuple(torch.split(order, counts.tolist()))
        return PoolIndex(req, gp, groups, pool.batch_size)


def depth_groups(pool: TreeBatch) -> tuple[Tensor, ...]:
    """Global indices of the nodes at depth 1, 2, ...: one [n_d] int64 tensor per depth."""
    return PoolIndex.of(pool).by_depth


def monotone_key(pool: TreeBatch, key: Tensor, index: PoolIndex | None = None) -> Tensor:
    """``key'_i = min(key_i, key'_parent(i))``: [N] -> [N], never larger than any ancestor's.

    A calibrated acceptance estimate can rise with depth; the chance that a node is accepted never
    exceeds its parent's, so clamping is correct, and it keeps key order ancestor-closed.
    """
    ix = index or PoolIndex.of(pool)
    out = key.clone()
    for idx in ix.by_depth[1:]:
        out[idx] = torch.minimum(out.index_select(0, idx), out.index_select(0, ix.gp[idx]))
    return out


def inverse(perm: Tensor) -> Tensor:
    """Inverse of a permutation: ``inv[perm[i]] = i``, O(N)."""
    return torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))


def positions(order_key: Tensor) -> Tensor:
    """Position of every element in ascending order of a *unique* int64 key: a permutation."""
    return inverse(torch.argsort(order_key))


def key_order(key: Tensor, tiebreak: Tensor | None = None) -> Tensor:
    """Position of every node by ``key`` descending, then ``tiebreak`` descending, then index.

    [N] float in [0, 1] (, [N] float in [0, 1]) -> [N] int64 permutation, one stable sort of
    ``key + TIE_WEIGHT * tiebreak`` in float64. A coarse (binned) key needs the tiebreak, else
    equal keys fall back to pool order, which favours low request indices. If both never rise
    from parent to child, neither does the composite, so the order stays ancestor-consistent.
    """
    score = composite_key(key, tiebreak)
    return inverse(torch.sort(score, descending=True, stable=True).indices)


def composite_key(key: Tensor, tiebreak: Tensor | None = None) -> Tensor:
    """``key + TIE_WEIGHT * tiebreak`` in float64 (``key`` alone without a tiebreak): the value
    :func:`key_order` sorts descending; any shape."""
    score = key.to(torch.float64)
    if tiebreak is not None:
        score = score + TIE_WEIGHT * tiebreak.to(torch.float64)
    return score


def group_order(group: Tensor, pos: Tensor) -> Tensor:
    """The elements sorted by (group, pos): [N] int64 permutation (``pos`` a permutation)."""
    return torch.argsort(group * max(group.numel(), 1) + pos)


def ranks_in_order(group: Tensor, perm: Tensor, mask: Tensor | None = None) -> Tensor:
    """Rank of each element among its group's ``mask`` elements along ``perm`` (grouped, e.g.
    from :func:`group_order`): [N] int64, ``UNRANKED`` outside ``mask``. O(N), no sort.
    """
    n = group.numel()
    out = torch.full((n,), UNRANKED, dtype=torch.int64, device=group.device)
    if n == 0:
        return out
    every = torch.ones(n, dtype=torch.bool, device=group.device) if mask is None else mask
    m, g = every.index_select(0, perm), group.index_select(0, perm)
    first = torch.ones(n, dtype=torch.bool, device=group.device)
    first[1:] = g[1:] != g[:-1]
    count = torch.cumsum(m.to(torch.int64), 0)
    # masked elements before each element's group: the value of count - m at the group's first
    # element, carried forward by a running max (those values never decrease along perm)
    before = torch.cummax(torch.where(first, count - m.to(torch.int64), 0), 0).values
    rank = count - 1 - before
    out[perm] = torch.where(m, rank, UNRANKED)
    return out


def rank_in_group(group: Tensor, pos: Tensor, mask: Tensor | None = None) -> Tensor:
    """Rank of each element among the ``mask`` elements of its group, in ``pos`` order.

    ``group``: [N] int64 >= 0; ``pos``: [N] int64, a permutation of ``0..N-1``; elements outside
    ``mask`` get ``UNRANKED``. One sort.
    """
    return ranks_in_order(group, group_order(group, pos), mask)


def rank_in_request(pool: TreeBatch, pos: Tensor, mask: Tensor | None = None) -> Tensor:
    """Rank of each node among its request's ``mask`` nodes in ``pos`` order: [N] int64."""
    return rank_in_group(pool.request_index(), pos, mask)


def top_per_request(pool: TreeBatch, pos: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
    """The first ``k[b]`` nodes of every request in ``pos`` order among ``mask``: [N] bool."""
    if pool.num_nodes == 0:
        return torch.zeros(0, dtype=torch.bool, device=pool.device)
    return rank_in_request(pool, pos, mask) < k[pool.request_index()]


def budgeted_select(
    pool: TreeBatch,
    pos: Tensor,
    eligible: Tensor,
    cap: Tensor,
    budget: int,
    index: PoolIndex | None = None,
) -> Tensor:
    """Ancestor-closed greedy selection in priority order (see the module docstring).

    ``pos``: [N] int64 strict priority (a permutation of ``0..N-1``, lower first);
    ``eligible``: [N] bool (an ineligible node also blocks its descendants); ``cap``: [B] int64
    per-request maximum; ``budget``: total maximum. Returns keep: [N] bool with
    ``keep.sum() <= budget`` and per-request counts <= cap.
    """
    n = pool.num_nodes
    if budget < 0:
        raise PolicyError(f"budget must be >= 0, got {budget}")
    if pos.shape != (n,) or eligible.shape != (n,) or cap.shape != (pool.batch_size,):
        raise PolicyError(
            f"pos/eligible must be [{n}] and cap [{pool.batch_size}], got {tuple(pos.shape)}, "
            f"{tuple(eligible.shape)}, {tuple(cap.shape)}"
        )
    if n == 0 or budget == 0:
        return torch.zeros(n, dtype=torch.bool, device=pool.device)
    ix = index or PoolIndex.of(pool)
    eff = torch.where(eligible, pos, n)
    for idx in ix.by_depth[1:]:
        eff[idx] = torch.maximum(eff.index_select(0, idx), eff.index_select(0, ix.gp[idx]))
    live = eff < n
    # already ancestor-consistent: pos is the greedy's order; else the record keys sort it
    consistent = bool(torch.equal(eff[live], pos[live]))
    order = pos if consistent else greedy_order(pos, live, ix)
    sorted_nodes = inverse(order)
    if bool((torch.bincount(ix.req[live], minlength=ix.batch_size) <= cap).all()):
        within = live  # no cap binds
    else:
        within = ranks_in_order(
            ix.req, sorted_nodes[torch.argsort(ix.req[sorted_nodes], stable=True)], live
        )
        within = live & (within < cap[ix.req])
    by_order = within[sorted_nodes]
    taken = by_order & (torch.cumsum(by_order.to(torch.int64), 0) <= budget)
    return taken[order]


def first_in_order(
    pos: Tensor, group: Tensor, cap: Tensor, budget: int, mask: Tensor | None = None
) -> Tensor:
    """The elements :func:`budgeted_select` takes when ``pos`` is already ancestors-first: each
    group's first ``cap[g]`` ``mask`` elements in ``pos`` order, then the first ``budget`` of
    those in ``pos`` order. ``pos``: [M] int64, a permutation of ``0..M-1`` (lower first);
    ``group``: [M] int64 indices into ``cap``; ``mask``: [M] bool (None: every element).
    Returns [M] bool. Fixed shape, no host sync: a mask instead of gathering the masked
    elements keeps their count on the device.
    """
    within = rank_in_group(group, pos, mask) < cap.index_select(0, group)
    if mask is not None:
        within &= mask
    order = inverse(pos)  # the element at each position
    ahead = torch.cumsum(within.index_select(0, order).to(torch.int64), 0)
    taken = torch.empty_like(within)
    taken[order] = within.index_select(0, order) & (ahead <= budget)
    return taken


def greedy_order(pos: Tensor, live: Tensor, index: PoolIndex) -> Tensor:
    """Position of every node in the order "repeatedly take the best-positioned node whose parent
    is taken" (``live`` nodes first, each ancestor-closed; the rest last): [N] int64 permutation.

    Key of a node: the *records* of the priorities on its root path, the entries larger than
    every entry after them (read root to node: ``p_1 .. p_d``, ``p_i`` is a record iff
    ``p_i > max(p_{i+1} .. p_d)``), a decreasing sequence; nodes are taken in lexicographic
    order of these sequences, a prefix before its extensions. Worked example: root ``a`` (pos
    20) with children ``b`` (12) and ``c`` (14), ``b``'s child ``e`` (9): keys a = (20),
    b = (20, 12), e = (20, 12, 9), c = (20, 14), so the order is a, b, e, c, which is what the
    greedy does (after ``a``, ``b`` beats ``c``; then ``e`` (9) beats ``c`` (14)). Sorting by the
    path maximum alone would tie a, b, c, e and can take ``c`` before ``e``. One stable sort
    per record column (at most the depth).
    """
    n = pos.numel()
    depth = len(index.by_depth)
    if n == 0 or depth == 0:
        return positions(pos)
    path = torch.full((n, depth), -1, dtype=torch.int64, device=pos.device)
    for d, idx in enumerate(index.by_depth):
        if d:
            path[idx] = path[index.gp[idx]]
        path[idx, d] = pos[idx]
    # exclusive suffix maximum along each row: max(p_{i+1} .. p_d), -1 past the end
    suffix = torch.cummax(path.flip(1), dim=1).values.flip(1)
    after = torch.cat([suffix[:, 1:], torch.full_like(suffix[:, :1], -1)], dim=1)
    record = (path >= 0) & (path > after)
    column = torch.cumsum(record.to(torch.int64), dim=1) - 1
    width = int(column[:, -1].max()) + 1
    keys = torch.full((n, width), -1, dtype=torch.int64, device=pos.device)
    rows = torch.arange(n, device=pos.device)[:, None].expand_as(path)
    keys[rows[record], column[record]] = path[record]
    keys[~live, 0] = n  # not taken: after every live node
    order = torch.arange(n, device=pos.device)
    for j in reversed(range(width)):
        order = order[torch.sort(keys[order, j], stable=True).indices]
    return inverse(order)


def path_score(pool: TreeBatch) -> Tensor:
    """``P_i = exp(path_logprob_i)``: [N] float32, non-increasing from parent to child."""
    return pool.path_logprob.to(torch.float32).exp()
