"""The fixed-shape layout of a step's candidates: every depth a [B, n_d] slab of slots.

Depth 1 holds each request's ``W`` root children (``n_1 = W``); every deeper depth holds the
children of a padded frontier of ``F = k0`` slots per request (``n_d = F W``), slot
``f W + w`` being the ``w``-th child (drafter rank) of frontier entry ``f``. A slot is *valid*
when its parent was expanded and the drafter returned that child; an invalid slot carries
``path = draft = -inf`` and is never eligible. Shapes depend only on (B, W, F, depth), so a
step is a fixed sequence of tensor ops with no host sync (issue #44), and a CUDA graph can
capture it.

Order. A frontier lists its entries by ascending slot, and every slab keeps (frontier entry,
rank) order, so concatenating the slabs of one request (depth 1, 2, ...) and the requests one
after another lists valid slots in exactly the packed :class:`~echo_core.tree.TreeBatch` order
(request, depth, parent, rank) that :func:`~echo_scheduler.pool.grow_pool` builds: ties broken
by index break the same way in both layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_scheduler.errors import PolicyError

INT64_MIN = -(1 << 63)
"""The key of an element :func:`first_by_key` leaves out."""


@dataclass(frozen=True, slots=True)
class DepthSlab:
    """One drafted depth in the fixed layout (module docstring): [B, n_d] each."""

    path: Tensor  # float32 log P of every slot, -inf where invalid
    draft: Tensor  # float32 log q(token | parent), -inf where invalid
    valid: Tensor  # bool

    def __post_init__(self) -> None:
        shape = self.path.shape
        if self.path.dim() != 2 or self.draft.shape != shape or self.valid.shape != shape:
            raise PolicyError(
                "a depth slab needs [B, n] path, draft and valid tensors, got "
                f"{tuple(self.path.shape)}, {tuple(self.draft.shape)}, {tuple(self.valid.shape)}"
            )
        if self.valid.dtype != torch.bool:
            raise PolicyError(f"valid must be bool, got {self.valid.dtype}")

    @property
    def score(self) -> Tensor:
        """``P = exp(path)`` (0 where invalid): [B, n_d] float32."""
        return self.path.to(torch.float32).exp()


@dataclass(frozen=True, slots=True)
class Frontier:
    """The slots of one depth a step may expand: ``slot`` [B, F] int64 indices into that depth's
    slab, ascending per request (padding repeats slot 0), ``expand`` [B, F] bool: draft this
    entry's children (False for padding)."""

    slot: Tensor
    expand: Tensor


def row_band(order: Tensor, mask: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's first ``width`` ``mask`` elements by ``order`` descending, ties to the lower
    column (``order`` [B, n] in [0, 2) where ``mask``, a :func:`~echo_scheduler.ranking.
    composite_key`): ``(band [B, n] bool, slot [B, width] int64, ok [B, width] bool)``, the
    band as a mask and compacted, its columns ascending; rows with fewer are padded with slot
    0 and ``ok`` False.

    One stable row sort of the int64 key ``bits(order)`` where ``mask`` and -1 elsewhere
    (:func:`tiered_key`: every masked element ahead of every other) puts the band in a row's
    first ``width`` places; a sort of those ``width`` columns (the others moved past the last
    column) lists them ascending. Fixed shape, no host sync."""
    n = order.shape[1]
    key = torch.where(mask, tiered_key(order), -1)
    top = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :width]
    taken = mask.gather(1, top)
    band = torch.zeros_like(mask).scatter_(1, top, taken)
    slot = torch.sort(torch.where(taken, top, n), dim=1).values
    ok = slot < n
    if top.shape[1] < width:  # fewer columns than the band's width (a shape, not a value)
        pad = width - top.shape[1]
        slot = torch.nn.functional.pad(slot, (0, pad), value=n)
        ok = torch.nn.functional.pad(ok, (0, pad), value=False)
    return band, torch.where(ok, slot, 0), ok


def key_ranks(key: Tensor, mask: Tensor) -> Tensor:
    """Rank of every element among its row's ``mask`` elements by the int64 ``key``
    descending, ties to the lower position ([..., n] each, [..., n] int64 out; meaningful
    where ``mask``): one stable sort along the last dimension, the masked count before each
    element in it."""
    by_row = torch.sort(key, dim=-1, descending=True, stable=True).indices
    count = torch.cumsum(mask.gather(-1, by_row).to(torch.int64), dim=-1)
    return torch.empty_like(count).scatter_(-1, by_row, count - 1)


def first_by_key(key: Tensor, mask: Tensor, count: Tensor, limit: int | None = None) -> Tensor:
    """The first ``count`` ``mask`` elements of every row (the last dimension) in the order
    (``key`` descending, position ascending): ``key`` [..., n] int64, ``mask`` [..., n] bool,
    ``count`` a tensor of the rows' shape ([B] for [B, n], 0-dim for [n]); returns [..., n]
    bool. All of a row's ``mask`` elements where it has no more than ``count``.

    ``limit``: a static bound on ``count`` (the caller's guarantee, not checked: a check would
    read the device). Where it is at most half the row (``2 limit <= n``), a top-``limit``
    threshold: with ``t`` the ``count``-th largest masked key of the row (a sorted top-k of the
    keys, the others at ``INT64_MIN``), take every masked element with key ``> t`` (fewer than
    ``count``), then the elements tied at ``t`` in position order, as many as are left
    (``cumsum(tied) <= count - #above``). Otherwise (or without a limit) a rank: one stable
    sort of the row (:func:`key_ranks`), ``rank < count``. Both exact for any keys, no
    tie-break folded into them; the threshold costs about twice the ops of the rank (each a
    few microseconds in eager torch on the CPU) and saves sorting a long row
    (``fixed_step_ab.py`` measures both). Fixed shape, no host sync."""
    n = key.shape[-1]
    if n == 0:
        return torch.zeros_like(mask)
    if limit is None or 2 * limit > n:
        return mask & (key_ranks(key, mask) < count.unsqueeze(-1))
    k = max(1, limit)
    masked = torch.where(mask, key, INT64_MIN)
    top = torch.topk(masked, k, dim=-1).values  # descending
    nth = (count - 1).clamp(min=0, max=k - 1).unsqueeze(-1)
    t = top.gather(-1, nth)  # the count-th largest (count = 0: the largest, nothing taken)
    above = mask & (masked > t)
    tied = mask & (masked == t)
    left = count.unsqueeze(-1) - above.sum(dim=-1, keepdim=True)
    return above | (tied & (torch.cumsum(tied.to(torch.int64), dim=-1) <= left))


def tiered_key(order: Tensor, tier: Tensor | None = None) -> Tensor:
    """An int64 key whose descending order is (``tier`` asc., ``order`` desc.): ``bits(order)
    - tier 2^62`` (any shape).

    A float64 ``x`` in [0, 2) has IEEE bits in [0, 2^62) that order as ``x`` does (``-0.0``
    is first made ``+0.0``, so equal values have equal keys), so tiers 0, 1, 2 land in
    [0, 2^62), [-2^62, 0) and [-2^63, -2^62): exact, where subtracting ``2 tier`` from the
    float would round away the tie-break in a composite key's low bits. Elements outside that
    range (ineligible slots: ``-inf`` orders, the tier past the last) get some key; callers
    mask them out."""
    x = torch.where(order > 0, order, 0.0).clamp(max=1.75).to(torch.float64)
    bits = x.view(torch.int64)
    if tier is None:
        return bits
    return bits - tier.clamp(min=0, max=2).to(torch.int64) * (1 << 62)


def child_parent_slot(front: Frontier, width: int) -> Tensor:
    """For every slot of the depth drafted from ``front``, its parent's slot in the depth
    before: [B, F W] int64 (``front.slot`` repeated ``width`` times along each row)."""
    return front.slot.repeat_interleave(width, dim=1)


def layer_confidence(slab: DepthSlab) -> Tensor:
    """``C_b(d) = max P`` over request b's valid depth-d slots, 0 without one: [B] float32
    (echo_gating.signals.layer_confidence in the fixed layout)."""
    return torch.where(slab.valid, slab.score, 0.0).amax(dim=1)


def sibling_margin(slab: DepthSlab, width: int) -> Tensor:
    """``M_b(d)`` (echo_gating.signals.sibling_margin) in the fixed layout: [B] float32.

    Siblings are the ``width`` slots of one frontier entry. Among them ``q_(1) - q_(2)`` of
    the draft probabilities, 0 when two tie for first; the request's value is the margin of its
    best valid slot (highest ``P``, ties to the largest margin), 0 without one."""
    b, n = slab.path.shape
    q = torch.where(slab.valid, slab.draft.to(torch.float32).exp(), 0.0).view(b, n // width, width)
    valid = slab.valid.view(b, n // width, width)
    first = q.amax(dim=2, keepdim=True)
    is_top = valid & (q >= first)
    second = torch.where(is_top, 0.0, q).amax(dim=2, keepdim=True)
    second = torch.where(is_top.sum(dim=2, keepdim=True) > 1, first, second)
    margin = (first - second).expand(b, n // width, width).reshape(b, n)
    best = torch.where(slab.valid, slab.path, -torch.inf).amax(dim=1, keepdim=True)
    at_best = slab.valid & (slab.path >= best)
    return torch.where(at_best, margin, 0.0).amax(dim=1)


SIGNALS = ("layer_confidence", "sibling_margin")
"""The gate signals the fixed layout computes (echo_gating.signals.GATE_SIGNALS)."""


def gate_signal(slab: DepthSlab, name: str, width: int) -> Tensor:
    """The gate signal ``name`` of every request at the slab's depth: [B] float32."""
    if name == "layer_confidence":
        return layer_confidence(slab)
    if name == "sibling_margin":
        return sibling_margin(slab, width)
    raise PolicyError(f"the fixed layout has no gate signal {name!r}; known: {SIGNALS}")
