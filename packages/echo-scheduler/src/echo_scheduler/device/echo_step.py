"""ECHO's per-step decisions as a fixed sequence of tensor ops over the fixed layout.

:class:`FixedEchoStep` makes the decisions of :class:`~echo_scheduler.policies.echo.EchoPolicy`
after each drafted depth and at selection (that module's docstring states every rule; this one
restates only what the layout changes) over :mod:`echo_scheduler.device.layout` slabs, with no
host read: no ``.item()``, ``.tolist()``, ``nonzero``, boolean indexing or loop over requests or
nodes. What the host decides per step (the budget ``K``, the caps, the prices, the mode: full,
depth 1 only, exploring) comes in through :class:`StepPrices`; what a step decides stays on the
device: truncation depths, keys, the band, the frontier to expand and the selection.

After depth d (the slab's children of the previous frontier):

1. keys ``u'_i = min(m_d(log P_i), u'_parent)`` (``P_i`` without maps);
2. the gate at a checkpoint: ``t_b <- d`` where the signal is below ``tau_d``;
3. the band: each request's ``k0`` best eligible depth-d slots by (key, ``P``, index) desc.,
   compacted into a [B, k0] frontier (ascending slot);
4. the band so far under the caps and the budget (:func:`~echo_scheduler.ranking.
   first_in_order` over the [B, d k0] band entries): ``w`` (the weakest kept key, ``u_min``
   while the budget is not full) and ``w_b`` (a request at its cap: its weakest kept key);
5. expand a frontier entry when it is kept, its request active, its children's bound
   ``min(u'_f, m_{d+1}(log P_f))`` reaches ``w`` (waived while the budget is not full, without
   a floor) and ``w_b``, and, under a node price p > 0, its estimate ``c_f`` less
   ``max(w, w_b)`` exceeds p; and only if the depth's estimated gain
   ``sum_f max(0, c_f - max(w, w_b) - p)`` covers the depth price. The gain is summed in
   float64 (in ``echo`` too): padded entries add zeros, so the two agree up to float64
   rounding of the summation order.

Selection: the eligible slots in (tier, key) order, each request's first ``cap_b``, then the
first K (``first_in_order`` under a mask), then the exact cut with every slot a candidate
(:func:`~echo_scheduler.cut.exact_cut`, ``gather=False``) or, exploring, the best
``explore_rows`` (:func:`~echo_scheduler.cut.best_rows`).

Where drafting would stop (no entry to expand, or ``K`` nothing more can use), the fixed
version returns a frontier with nothing to expand; a caller that drafts a fixed number of
depths drafts it anyway (its children are invalid slots) and the decisions do not change: a
depth after a frontier with nothing to expand passes every gate (the packed drivers never
draft it), and ``drafted_depths`` counts the depths a packed driver would have drafted (the
ledger's drafter calls).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cost import LatencyModel
from echo_scheduler.cut import RowBuffers, best_rows, exact_cut
from echo_scheduler.device.layout import (
    DepthSlab,
    Frontier,
    child_parent_slot,
    first_by_key,
    row_band,
    tiered_key,
)
from echo_scheduler.device.layout import gate_signal as slab_signal
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import RowPrice
from echo_scheduler.ranking import composite_key

DEPTH, WIDTH, REINVEST = 0, 1, 2
"""Selection tiers, taken in this order (as in echo_scheduler.policies.echo)."""


@dataclass(frozen=True, slots=True)
class StepPrices:
    """What the host decides for one step (echo_scheduler.interface.StepBatch's scalars)."""

    budget: int  # K
    caps: Tensor  # [B] int64 on the step's device
    min_utility: float = 0.0
    node_price: float = 0.0
    depth_price: float = 0.0
    row_price: RowPrice | None = None
    explore_rows: int = 0  # > 0: this step explores (its best rows whatever their price)

    def __post_init__(self) -> None:
        if self.budget < 0 or self.caps.dim() != 1 or self.caps.dtype != torch.int64:
            raise PolicyError(
                f"a step needs K >= 0 and [B] int64 caps, got {self.budget}, "
                f"{tuple(self.caps.shape)} {self.caps.dtype}"
            )


def layout_rows(config: PolicyConfig, batch_size: int) -> int:
    """Verify rows of a step whose fixed layout is full to ``Dmax``: ``T_max = B + B (W +
    (Dmax - 1) k0 W)`` (roots, then every slot of echo_scheduler.device.layout), the most the
    exact cut can price."""
    w = config.draft_width
    return batch_size * (1 + w + (config.max_depth - 1) * config.topk * w)


@dataclass(slots=True)
class StepScalars:
    """A step's numbers from :class:`StepPrices` in tensors on the step's device: what the
    fixed step reads, so that no price is baked into its op sequence. A CUDA graph of the step
    captures these buffers; :meth:`load` refills them for the next step (device-side fills, no
    host sync) and one graph serves every step of the same shapes, mode and budget bucket
    (:func:`budget_bucket`), whatever its prices and whatever latency model prices its rows
    (the model's values at every row count sit in ``latency``, recomputed on the device when
    the model changes)."""

    budget: Tensor  # int64, K
    min_utility: Tensor  # float32, u_min (compared with float32 keys, as a float would be)
    floored: Tensor  # bool, u_min > 0 (decided on the float, not on its float32 rounding)
    node_price: Tensor  # float32, p
    node_priced: Tensor  # bool, p > 0 (likewise)
    depth_price: Tensor  # float64 (the depth's gain is summed in float64)
    rate: Tensor  # float64, the row price's lam (0 without a row price)
    scale: Tensor  # float64, the row price's scale (1 without a row price)
    latency: Tensor  # [T_max + 1] float64, the row price's latency model at T = 0..T_max
    latency_model: LatencyModel | None = None  # the model ``latency`` holds (None: not filled)

    @classmethod
    def of(cls, prices: StepPrices, device: torch.device, rows: int) -> StepScalars:
        """Fresh buffers on ``device`` holding ``prices``' numbers; the latency table covers
        T = 0..``rows`` (:func:`layout_rows`)."""

        def make(dtype: torch.dtype) -> Tensor:
            return torch.zeros((), dtype=dtype, device=device)

        f32, f64, flag = torch.float32, torch.float64, torch.bool
        table = torch.zeros(rows + 1, dtype=f64, device=device)
        out = cls(
            make(torch.int64), make(f32), make(flag), make(f32), make(flag), make(f64),
            make(f64), make(f64), table,
        )  # fmt: skip
        out.load(prices)
        return out

    @property
    def row(self) -> RowBuffers:
        """The row price's buffers, as the exact cut reads them."""
        return RowBuffers(self.rate, self.scale, self.latency)

    def load(self, prices: StepPrices) -> None:
        """Write ``prices``' numbers into these buffers, in place."""
        row = prices.row_price
        self.budget.fill_(prices.budget)
        self.min_utility.fill_(prices.min_utility)
        self.floored.fill_(prices.min_utility > 0)
        self.node_price.fill_(prices.node_price)
        self.node_priced.fill_(prices.node_price > 0)
        self.depth_price.fill_(prices.depth_price)
        self.rate.fill_(0.0 if row is None else row.rate)
        self.scale.fill_(1.0 if row is None else row.scale)
        if row is not None and row.latency is not self.latency_model:
            rows = self.latency.numel() - 1
            self.latency.copy_(row.latency_table(rows, self.latency.device))
            self.latency_model = row.latency


class FixedEchoStep:
    """One step of ECHO's decisions in the fixed layout (module docstring)."""

    def __init__(
        self,
        config: PolicyConfig,
        gate: GatePolicy,
        prices: StepPrices,
        scalars: StepScalars | None = None,
    ) -> None:
        """``scalars``: buffers already holding ``prices``' numbers (a captured graph's own);
        by default fresh ones. The step's ops read the numbers only through them: which ops
        run, and with which constants, depends on the shapes, the gate, the mode
        (``explore_rows``), whether there is a row price and the budget's bucket
        (:func:`budget_bucket`: the static bound of the selection's top-k), never on a price's
        value or on the row price's latency model. ``prices`` itself then only says which of
        those apply. Buffers reloaded for a later step must keep its budget in that bucket
        (more would be cut to the bound): a graph of the step is keyed by the bucket too."""
        self.config, self.gate, self.prices = config, gate, prices
        self.width = config.draft_width
        caps = prices.caps
        self.batch_size = int(caps.shape[0])
        self.device = caps.device
        if scalars is None:
            scalars = StepScalars.of(prices, caps.device, layout_rows(config, self.batch_size))
        self.scalars = scalars
        self.budget_cap = budget_bucket(prices.budget)  # static: the top-k sizes (K <= it)
        self.truncated_at = torch.where(caps > 0, config.max_depth, 0)
        self.drafted_depths = torch.zeros((), dtype=torch.int64, device=self.device)
        self.keys: list[Tensor] = []  # u' per depth, [B, n_d] float32
        self.slabs: list[DepthSlab] = []
        self.bands: list[Tensor] = []  # [B, n_d] bool
        self.eligible: list[Tensor] = []  # [B, n_d] bool, fixed once the depth is drafted
        self.orders: list[Tensor] = []  # [B, n_d] float64, key + 2^-30 P (composite_key)
        self.fronts: list[Frontier] = []  # the band of each depth, compacted: [B, k0]
        self.front_ok: list[Tensor] = []  # which compacted band entries are real: [B, k0]
        self.band_keys: list[Tensor] = []  # their keys, [B, k0]
        self.band_orders: list[Tensor] = []  # their composite_key, [B, k0]
        self.closed = False  # the latest depth was folded as the last: nothing expanded

    @property
    def depth(self) -> int:
        """Depths drafted so far this step."""
        return len(self.slabs)

    @property
    def exploring(self) -> bool:
        return self.prices.explore_rows > 0

    def fold_depth(self, slab: DepthSlab, last: bool = False, gate_empty: bool = True) -> Frontier:
        """Fold in depth ``d = depth + 1`` (the children of the last frontier, or the roots'
        at d = 1) and decide the next frontier (module docstring, 1-5). ``last``: no deeper
        depth will be drafted (the mode drafts depth 1 only, or ``d`` is the deepest): the
        band is still extended, for the selection, and nothing is expanded. ``gate_empty``
        False: a depth with no valid slot in the whole batch truncates no one at its
        checkpoint (a drafter over a finished pool, echo_sglang's, ends drafting there before
        the gate); True: it truncates every request, whose confidence there is 0 (a drafter
        that drafts every depth it is asked for)."""
        d = self.depth + 1
        self._check(slab, d)
        asked = None if d == 1 else self.fronts[-1].expand.any()  # a packed driver drafts d
        self.drafted_depths = self.drafted_depths + (1 if asked is None else asked.long())
        key = self._keys(slab, d)
        if self.gate.is_checkpoint(d):
            passed = self.gate.gate(d, slab_signal(slab, self.gate.signal, self.width))
            if asked is not None:
                passed |= ~asked  # a depth no driver would draft gates no one
            if not gate_empty:
                passed |= ~slab.valid.any()
            self.truncated_at = torch.where(~passed & (self.truncated_at > d), d, self.truncated_at)
        eligible = self._eligible(key, slab.valid, d)
        order = composite_key(key, slab.score)
        band, front_slot, front_ok = row_band(order, eligible, self.config.topk)
        self.eligible.append(eligible)
        self.orders.append(order)
        self.keys.append(key)
        self.slabs.append(slab)
        self.bands.append(band)
        self.front_ok.append(front_ok)
        self.band_keys.append(key.gather(1, front_slot))
        self.band_orders.append(order.gather(1, front_slot))
        self.closed = last or d >= self.config.max_depth
        if self.closed:
            front = Frontier(front_slot, torch.zeros_like(front_ok))
        else:
            front = Frontier(front_slot, self._expand(slab, key, d, front_slot, front_ok))
        self.fronts.append(front)
        return front

    def _check(self, slab: DepthSlab, d: int) -> None:
        """Raise unless ``slab`` is depth d's: [B, n_d] float32 on the step's device."""
        expected = self.width if d == 1 else self.config.topk * self.width
        if slab.path.shape != (self.batch_size, expected):
            raise PolicyError(
                f"depth {d} needs a [{self.batch_size}, {expected}] slab, got "
                f"{tuple(slab.path.shape)}"
            )
        for name in ("path", "draft"):
            t = getattr(slab, name)
            if t.dtype != torch.float32 or t.device != self.device:
                raise PolicyError(
                    f"depth {d}'s slab {name} must be float32 on {self.device}, got {t.dtype} "
                    f"on {t.device}"
                )

    def _keys(self, slab: DepthSlab, d: int) -> Tensor:
        """``u'`` of the depth-d slots: [B, n_d] float32."""
        maps = self.gate.acceptance_maps
        if maps is None:
            return slab.score
        own = maps.expected_accept_at(d, slab.path)
        if d == 1:
            return own
        parent = child_parent_slot(self.fronts[-1], self.width)
        return torch.minimum(own, self.keys[-1].gather(1, parent))

    def _eligible(self, key: Tensor, valid: Tensor, depth: int) -> Tensor:
        """``d_i <= t_b`` and, under a floor (not exploring), ``u'_i >= u_min``, for the slots
        of the depth just drafted (after its gate). Fixed from then on: a later checkpoint d'
        truncates only below d', where a truncated request drafts nothing."""
        eligible = valid & (self.truncated_at >= depth).unsqueeze(1)
        if not self.exploring:
            eligible &= (key >= self.scalars.min_utility) | ~self.scalars.floored
        return eligible

    def _expand(self, slab: DepthSlab, key: Tensor, d: int, slot: Tensor, ok: Tensor) -> Tensor:
        """Which of the depth-d band entries (``slot``, ``ok``: [B, k0]) to expand (module
        docstring, 4-5): [B, k0] bool. Depth d's keys, slab and band entries are already
        folded in; its frontier is not."""
        p, v = self.prices, self.scalars
        b, k0 = slot.shape
        if b == 0:  # an empty batch (a shape, not a value: no read)
            return torch.zeros_like(ok)
        # 4. the band so far, [B, d k0] in packed order, under the caps and the budget
        band_key = torch.cat(self.band_keys, dim=1)
        band_ok = torch.cat(self.front_ok, dim=1)
        orders = torch.cat(self.band_orders, dim=1)
        top = first_in_rows(orders, band_ok, p.caps, v.budget, limit=self.budget_cap)
        held = top.sum(dim=1)
        floor = v.min_utility
        filled = held.sum() >= v.budget
        kept_keys = torch.where(top, band_key, torch.inf)
        weakest = torch.where(filled, torch.maximum(kept_keys.min(), floor), floor)
        own_weakest = torch.where(held >= p.caps, kept_keys.amin(dim=1), -torch.inf)  # w_b
        kept_now = top[:, -k0:]
        # 5. the children's bound and estimate, the rules, the depth's gain
        own = key.gather(1, slot)
        path = slab.path.gather(1, slot)
        best_q = torch.where(slab.valid, slab.draft, -torch.inf).amax(dim=1, keepdim=True)
        guess_logp = path + best_q.clamp(max=0.0)
        maps = self.gate.acceptance_maps
        if maps is None:
            bound, guess = own, torch.minimum(own, guess_logp.exp())
        else:
            n = path.numel()
            logp = torch.cat([path.reshape(-1), guess_logp.reshape(-1).clamp(min=-1e4)])
            both = maps.expected_accept_at(d + 1, logp)
            bound = torch.minimum(own, both[:n].view(b, k0))
            guess = torch.minimum(own, both[n:].view(b, k0))
        active = (self.truncated_at > d).unsqueeze(1)
        go = kept_now & ok & active
        go &= (bound >= weakest) | (~filled & ~v.floored)  # waived: budget open, no floor
        at_cap = own_weakest.unsqueeze(1)
        go &= bound >= at_cap
        weakest_b = torch.maximum(weakest, at_cap)
        go &= (guess - weakest_b > v.node_price) | ~v.node_priced  # p > 0 only
        gain = torch.where(go, guess - weakest_b - v.node_price, 0.0).clamp(min=0)
        pays = gain.double().sum() >= v.depth_price
        return go & pays

    def select(self) -> Tensor:
        """The step's selection over every drafted slot: [B, S] bool, the slabs side by side
        (module docstring)."""
        p = self.prices
        b = self.batch_size
        if not self.slabs:
            return torch.zeros(b, 0, dtype=torch.bool, device=self.device)
        key = torch.cat(self.keys, dim=1)
        eligible = torch.cat(self.eligible, dim=1)
        band = torch.cat(self.bands, dim=1)
        truncated = (self.truncated_at < self.config.max_depth).unsqueeze(1)
        other = torch.where(truncated, WIDTH, REINVEST)
        tier = torch.where(eligible, torch.where(band, DEPTH, other), REINVEST + 1)
        order = torch.cat(self.orders, dim=1)
        keep = first_in_rows(
            order, eligible, p.caps, self.scalars.budget, tier, self.budget_cap
        ).reshape(-1)
        flat_key = key.reshape(-1)
        if p.row_price is not None and self.gate.acceptance_maps is not None:
            if self.exploring:
                score = torch.cat([s.score for s in self.slabs], dim=1).reshape(-1)
                keep = best_rows(flat_key, keep, p.explore_rows, score)
            else:
                keep = exact_cut(
                    flat_key, keep, b, p.row_price, False, self.scalars.row, self.budget_cap
                )
        return keep.view(b, -1)


def first_in_rows(
    order: Tensor,
    mask: Tensor,
    caps: Tensor,
    budget: int | Tensor,
    tier: Tensor | None = None,
    limit: int | None = None,
) -> Tensor:
    """Each row's first ``caps[b]`` ``mask`` elements, then the first ``budget`` of those, all
    in the order (``tier`` asc., ``order`` desc., flat index asc.): [B, n] bool
    (:func:`~echo_scheduler.ranking.first_in_order` in the fixed layout, rows as groups).

    The flat index is the packed order (echo_scheduler.device.layout), so ties break as there;
    within a row it is the column. ``order`` is a :func:`~echo_scheduler.ranking.
    composite_key` (in [0, 2) where ``mask``) and ``tier`` in {0, 1, 2} where ``mask``. Both
    go into one int64 key (:func:`~echo_scheduler.device.layout.tiered_key`), and
    :func:`~echo_scheduler.device.layout.first_by_key` takes the first elements twice: along
    the rows (``caps``: a stable row sort), then over the flat elements (``budget``, with
    ``limit`` its static bound: a top-``limit`` instead of a sort of every slot where the
    bound is at most half of them). Fixed shape, no host sync."""
    b, n = order.shape
    key = tiered_key(order, tier)
    within = first_by_key(key, mask, caps)
    budget = torch.as_tensor(budget, dtype=torch.int64, device=order.device)
    taken = first_by_key(key.reshape(-1), within.reshape(-1), budget, limit)
    return taken.view(b, n)


def budget_bucket(budget: int) -> int:
    """The static bound a step's selection assumes for its budget ``K``: the least power of
    two ``>= K`` (1 for K <= 1). A step's top-k sizes depend on it, so a captured graph serves
    the steps of one bucket."""
    return 1 << max(budget - 1, 0).bit_length()
