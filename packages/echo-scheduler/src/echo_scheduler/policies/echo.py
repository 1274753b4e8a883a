"""Policy 6, ECHO: sparse confidence gating + elastic two-priority allocation of one budget K.

Our reading of the paper's Algorithm 1 (docs/PAPER.md), refined by simulation (see the README).

Key. ``u_i = m_{d_i}(path_logprob_i)`` with the gate's calibrated acceptance maps (the estimated
P(node accepted), its marginal utility), else the path score ``P_i``; then
``u'_i = min(u_i, u'_parent)`` so the key never rises along a path. Ties (the maps are step
functions) go to the higher path score, then the lower index.

Gates (echo_scheduler.gating). At a checkpoint d (``gate.is_checkpoint(d)``) a request whose
layer confidence ``C_b(d) < tau_d`` is truncated at ``t_b = d``: it drafts no deeper this step
and none of its nodes deeper than d is ever selected (``t_b = Dmax`` for requests never
truncated). With ``slack`` a truncation binds only under contention: when after depth d's
Priority 1 the budget is not full (the weakest selected key is the floor ``u_min``), the requests
truncated at d are re-admitted (``t_b = Dmax``) and draft on like the others, under the floor,
the node price and the depth's gain; under a full budget the gate truncates as above. (A
depth-1-only step drafts no deeper for anyone, so there a truncation only moves the request's
extra siblings to the width tier.)

Selection tiers over the eligible nodes (``d_i <= t_b``), taken in order (tier, key desc):

- 0 base (only with ``reserve_base``, the literal reading): per request its ``n0 = N - 1`` best
  nodes with ``d <= D0``, minus those deeper than ``t_b`` (a failed gate frees them);
- 1 depth (Priority 1): per request and depth its ``k0`` best nodes (the EAGLE-2 band);
- 2 width (Priority 2): every other node of a truncated request (its extra siblings);
- 3 reinvest (low contention): every other node.

:func:`budgeted_select` takes them in that order (a node waits for its parent) until K nodes, at
most ``max_nodes[b]`` per request. So no truncated request is widened while a Priority-1 node is
left; with surplus the trees grow deeper, then wider. The selection for K is a subset of the one
for K + 1 on the same pool, and with K >= every eligible band node all of them are selected.
Measured (compare.py): reserving the base costs accepted tokens whenever K <= B n0, because a
fixed per-request share ignores marginal utility; hence ``reserve_base=False`` by default.

Drafting. Every expanded node is drafted into ``W = max(k0, Wmax)`` children, so the pool holds
the siblings width expansion may take (width never exceeds Wmax). After depth d, each active
request (not truncated, below its cap) expands its ``k0`` best depth-d nodes among those that
tiers 0-1 currently select and whose children could still be selected: when the budget is full,
``min(u'_f, m_{d+1}(path_logprob_f))`` (an upper bound of any child's key) must reach the key
``w`` of the weakest selected node (``w = 0`` while the budget is not full). Drafting stops when
no node qualifies or when the depth's estimated gain ``sum_f max(0, c_f - w)`` (``c_f``: estimated
best-child key, see ``_child_keys``) is below ``config.min_depth_gain`` tokens, the price of one
more drafter call. With ``reserve_base`` depths below D0 are drafted for every request.

Cost floor (elastic K, beyond the paper). The engine may pass ``batch.min_utility`` = u_min, the
acceptance a node needs to pay for its verify row: with ``R`` the step's throughput (tokens/s) and
``dt`` the marginal verify latency of one more row, ``d/dk [(B + G(k)) / t(B + k)] >= 0`` iff
``u_k >= R * dt`` (see echo_scheduler.elastic). Nodes with ``u' < u_min`` are not eligible, the
weakest-key bound ``w`` is at least ``u_min``, and ``batch.depth_price`` (when given) replaces
``min_depth_gain``; with ``batch.node_price`` each expanded node must promise that much beyond
``w`` (its drafter row) and the depth's gain is counted net of it. If no depth-1 node could pay
its row (``m_1(0) - u_min - node price <= 0``, or the batch's roots together not the depth price:
a root's children bring at most one token between them) the step is not drafted at all: under
saturation ECHO falls back to plain decoding at no drafting cost. That pre-check is optimistic
(the best a depth-1 node could be worth), so a priced ECHO also keeps a
:class:`~echo_scheduler.ledger.DraftLedger` of what its drafted steps actually returned net of
every row, expansion and call at their prices, and decodes plainly (probing now and then) while
that ledger says drafting loses at the current load. It also keeps a cheaper mode: depth 1
only (one drafter call, the roots' children, priced and cut as usual), judged by a ledger of its
own; each step takes the mode whose ledger promises more (the other probed on a doubling clock),
and ECHO decodes plainly only while both say drafting loses
(:class:`~echo_scheduler.ledger.ModeChooser`). Deterministic replay on the CPU profile, 80
composed steps per cell, of the depth-1 fallback before the chooser (docs/BENCHMARKS.md): +4.0%
on mtbench at B = 1 and +1.7% on summarize at B = 4, where a one-token chain paid and full
drafting did not; -0.7 / -0.8% at B = 16, the cost of trying it.
With ``batch.row_price`` (and maps) the selection is finally cut to the rows worth their verify
time at this step's size (:func:`echo_scheduler.cut.exact_cut`): the floor prices a row from
recent steps, the cut from the rows actually selected.

Sampled exploration (``explore_roots = S > 0``, optional). A step the mode chooser drafts only
to learn (:attr:`~echo_scheduler.ledger.ModeChooser.exploring`: a mode's first steps in a load
bucket, or a probe while drafting loses) expands the roots of at most S live requests, those
whose serials hash lowest (:func:`explore_sample`), instead of every live root. The ledger's
value is per root expanded (``v = V / R``, R = S), so the estimate is the same in expectation;
what changes is the price of learning: the drafter runs for S requests, and the others' head
rows stay queued (a request that finishes undrafted never runs them). Where drafting pays the
mode is chosen to pay, not to learn, and every live root is expanded as before.

Request history (``echo_history``, optional). With a :class:`~echo_scheduler.history.
RequestHistory` and the engine's request serials (``batch.requests``), every key of request r is
rescaled to ``min(1, f_r u'_i)``, f_r its realised over predicted acceptance of recent steps
(echo_scheduler.history); bounds and estimates of children are rescaled alike. Without serials
the policy is plain ECHO.

Aging (``echo_aging``, optional). One global budget can leave a low-confidence request without
a single verified draft row for many steps while its batch mates verify theirs (the replay's
``starved_max``: up to 20 steps of 20 at B = 256). With ``aging = A > 0`` and request serials, a
request that went ``A`` consecutive such steps has its best depth-1 node selected first (tier
0), past the floor and the exact cut, until it verifies a row again. The budget K and the
per-request caps still bind.

Cost. Within a step nothing about an older node changes: its key, and whether it is in its
request's band (the ``k0`` best eligible nodes per depth). So each depth looks up keys for its
new nodes only (``_grown_base``), extends the band carried from the last depth
(``_plan_from_band``), and decides from the new nodes and the band; ``select`` takes the
eligible nodes in (tier, key) order under the caps and the budget (``_select_in_tiers``). Every
parent was expanded, so it is in the band: band and eligibility are ancestor-closed and that
order lists ancestors first, which is why no tree-aware selection is needed. The full ranking
(``_order`` + :func:`~echo_scheduler.ranking.budgeted_select`) remains for aging and a reserved
base; a hypothesis test pins the shortcuts to it bit for bit. What it still costs, and that on a
GPU it costs too much: docs/BENCHMARKS.md, session 21.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.maps import AcceptanceMaps
from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cut import exact_cut
from echo_scheduler.errors import PolicyError
from echo_scheduler.gating import apply_gate
from echo_scheduler.history import Presence, RequestHistory
from echo_scheduler.interface import BasePolicy, DraftPlan, StepBatch, StepOutcome
from echo_scheduler.ledger import DraftedStep, DraftLedger, ModeChooser
from echo_scheduler.policies.frontier import expand_all
from echo_scheduler.ranking import (
    PoolIndex,
    budgeted_select,
    first_in_order,
    group_order,
    inverse,
    key_order,
    monotone_key,
    path_score,
    positions,
    rank_in_group,
    ranks_in_order,
    top_per_request,
)

BASE, DEPTH, WIDTH, REINVEST = 0, 1, 2, 3
"""Selection tiers, taken in this order."""

STEP_MODES = ("floor", "plain", "shallow", "full")
"""How a priced step was decided (``EchoPolicy.step_modes`` counts them): ``floor``, the
pre-check (with maps) found no depth-1 draft worth its row, so plain decoding; else the mode
chooser's ``plain``, ``shallow`` (depth 1 only) or ``full``."""


class EchoPolicy(BasePolicy):
    """ECHO (gate = calibrated sparse GatePolicy) and its ablations (dense, fixed, none)."""

    def __init__(
        self,
        config: PolicyConfig,
        gate: GatePolicy | None = None,
        name: str = "echo",
        reserve_base: bool = False,
        learn_drafting: bool = True,
        history: RequestHistory | None = None,
        aging: int = 0,
        slack: bool = False,
        explore_roots: int = 0,
    ) -> None:
        """``learn_drafting``: keep a :class:`DraftLedger` of priced steps (module docstring);
        False is ECHO without it (an ablation). ``history``: rescale each request's keys by its
        realised acceptance (module docstring). ``aging``: steps without a verified row after
        which a request's best depth-1 node is selected first (0: never; module docstring).
        ``slack``: a gate's truncation binds only while the budget is full (module
        docstring). ``explore_roots``: a step the mode chooser drafts only to learn (its
        ``exploring``) expands at most this many roots, a fixed sample of the live requests
        (module docstring; 0: every live root)."""
        if aging < 0 or (aging and reserve_base):
            raise PolicyError(f"aging must be >= 0 steps and excludes reserve_base, got {aging}")
        if explore_roots < 0:
            raise PolicyError(f"explore_roots must be >= 0, got {explore_roots}")
        if slack and reserve_base:
            raise PolicyError("slack excludes reserve_base (the base is drafted for every request)")
        super().__init__()
        self.config = config
        self.gate = gate if gate is not None else GatePolicy.none()
        self.name = name
        self.reserve_base = reserve_base
        self.ledger = DraftLedger() if learn_drafting else None  # full drafting
        self.shallow_ledger = DraftLedger() if learn_drafting else None  # depth 1 only
        self.modes = (
            None
            if self.ledger is None or self.shallow_ledger is None
            else ModeChooser(self.ledger, self.shallow_ledger)
        )
        self._shallow = False  # this step drafts depth 1 only
        self.truncated_at = torch.zeros(0, dtype=torch.int64)  # [B], Dmax = never truncated
        self._live = 0  # this step's requests allowed to draft
        self._roots = self._expanded = 0  # roots expanded under the ledger; deeper nodes
        self.history = history
        self._factor: Tensor | None = None  # [B] this step's f_r (None: no history)
        self._predicted: Tensor | None = None  # [B] sum of the selected nodes' unscaled keys
        self._factor_max = 1.0  # the largest f_r this step (the pre-check's optimism)
        self.aging = aging
        self.slack = slack
        self.explore_roots = explore_roots
        self._starved: dict[int, int] = {}  # serial -> consecutive steps without a verified row
        self._presence = Presence()  # when to forget a request's count
        self._aged: Tensor | None = None  # [B] bool, this step's aged requests (None: none)
        self._plain_draft_s: float | None = None  # d_0: undrafted steps' draft phase, seconds
        self.step_modes: dict[str, int] = dict.fromkeys(STEP_MODES, 0)  # priced steps per mode
        self._memo: _Ranked | None = None  # the last depth's ranking, for select on that pool
        self._first_best: tuple[AcceptanceMaps, float] | None = None  # maps -> m_1(0)
        self._band_held = torch.zeros(0, dtype=torch.int64)  # [B] band nodes per request
        self._carry: tuple[TreeBatch, Tensor, Tensor | None] | None = None  # pool, u', band

    def active_gate(self) -> GatePolicy:
        return self.gate

    def set_gate(self, gate: GatePolicy) -> bool:
        """Swap in recalibrated gates (the engine does it between steps). Within a step, keys
        already carried from an earlier depth were computed with the old maps: they are dropped,
        so the rest of the step ranks from scratch."""
        self.gate = gate
        self._carry = self._memo = None
        return True

    def _start(self, batch: StepBatch) -> None:
        self.truncated_at = torch.where(batch.max_nodes > 0, self.config.max_depth, 0)
        self._roots = self._expanded = 0
        self._factor = self._predicted = None
        self._factor_max = 1.0
        self._aged = None
        self._memo = None
        self._band_held = torch.zeros_like(batch.max_nodes)  # band nodes per request so far
        self._carry = None
        if self.aging and batch.requests is not None:
            ids = batch.requests.tolist()  # host tensor: no device sync
            for r in self._presence.step(ids):
                self._starved.pop(r, None)
            aged = [self._starved.get(r, 0) >= self.aging for r in ids]
            if any(aged):
                self._aged = torch.tensor(aged, device=batch.max_nodes.device)
        if self.history is not None and batch.requests is not None:
            f = self.history.factors(batch.requests)  # host
            self._factor_max = float(f.max()) if f.numel() else 1.0
            self._factor = f.to(batch.max_nodes.device)

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        width = self.config.draft_width
        maps = self.gate.acceptance_maps
        is_priced = priced(batch)
        live = int((batch.max_nodes > 0).sum())
        if maps is not None and is_priced:
            best = min(1.0, self._best_first(maps, batch.max_nodes.device) * self._factor_max)
            if not first_depth_pays(best, batch, live, self._depth_price()):
                width = 0  # not even the best depth-1 draft pays for its rows: plain decoding
                self.step_modes["floor"] += 1
        self._live = live
        self._shallow = False
        drafting = batch.max_nodes > 0
        if width and is_priced and self.modes is not None:
            mode = self.modes.choose(live, self._depth_price())
            self._shallow = mode == "shallow"  # depth 1 paid more lately
            if mode == "plain":
                width = 0  # drafting lost lately at this load: plain decoding (probes aside)
            self._roots = live if width else 0  # a drafted step the ledger will record
            if width and self.modes.exploring and 0 < self.explore_roots < live:
                drafting = explore_sample(batch, drafting, self.explore_roots)
                self._roots = self.explore_roots
            self.step_modes[mode] += 1
        return DraftPlan.roots(torch.where(drafting, width, 0))

    def _best_first(self, maps: AcceptanceMaps, device: torch.device) -> float:
        """``m_1(0)`` (:func:`best_first_value`), once per set of maps."""
        cached = self._first_best
        if cached is None or cached[0] is not maps:
            self._first_best = cached = (maps, best_first_value(maps, device))
        return cached[1]

    @staticmethod
    def _row_cost(batch: StepBatch, verified: int) -> float:
        """Tokens ``verified`` draft rows cost: ``R_run (t(B + N) - t(B))`` under the step's
        row price, else ``u_min N``."""
        price = batch.row_price
        if price is None:
            return batch.min_utility * verified
        total = price.seconds_at(batch.batch_size + verified)
        return price.rate * (total - price.seconds_at(batch.batch_size))

    def observe(self, outcome: StepOutcome) -> None:
        """Fold a priced, drafted step's realised value into the ledger, and each request's
        accepted length and predicted acceptance into the history."""
        batch = self._batch
        if self.history is not None and batch is not None and batch.requests is not None:
            predicted = self._predicted
            if predicted is not None:
                seen = (outcome.verified > 0).cpu()
                self.history.update(
                    batch.requests[seen],
                    outcome.accepted_lengths.cpu()[seen],
                    predicted.cpu()[seen],
                )
        if self.aging and batch is not None and batch.requests is not None:
            rows = outcome.verified.tolist()  # one host copy
            some = sum(rows) > 0
            for r, v in zip(batch.requests.tolist(), rows, strict=True):
                self._starved[r] = self._starved.get(r, 0) + 1 if some and v == 0 else 0
        if outcome.draft_s is not None and not self._roots:  # an undrafted step's set-up
            base = self._plain_draft_s
            self._plain_draft_s = (
                outcome.draft_s if base is None else base + 0.25 * (outcome.draft_s - base)
            )
        if self.ledger is None or batch is None or not self._roots:
            return
        verified = int(outcome.verified.sum())
        step = DraftedStep(
            live=self._live,
            roots=self._roots,
            accepted=int(outcome.accepted_lengths.sum()),
            verified=verified,
            expansions=self._roots + self._expanded,
            calls=self.depth,
            row_cost=self._row_cost(batch, verified),
            node_price=batch.node_price or 0.0,
            call_price=self._depth_price(),
            draft_cost=self._draft_cost(batch, outcome.draft_s),
        )
        ledger = self.shallow_ledger if self._shallow else self.ledger
        if ledger is not None:
            ledger.record(step)

    def _draft_cost(self, batch: StepBatch, draft_s: float | None) -> float | None:
        """``c_draft = R_run max(d - d_0, 0)`` tokens for a timed draft phase of ``d`` seconds
        (the ledger's measured drafting), ``d_0`` the moving average (weight 0.25) of undrafted
        steps' draft phases (their set-up, paid by every step; 0 before any); None when the
        step was not timed or has no run rate."""
        if draft_s is None or batch.row_price is None:
            return None
        base = self._plain_draft_s or 0.0
        return batch.row_price.rate * max(draft_s - base, 0.0)

    def _depth_price(self) -> float:
        """:func:`depth_price` of this step."""
        return depth_price(self.batch, self.config)

    @property
    def truncated(self) -> Tensor:
        """[B] bool: requests that failed a checkpoint this step."""
        return self.truncated_at < self.config.max_depth

    def key(self, pool: TreeBatch, index: PoolIndex | None = None) -> Tensor:
        """Ranking key of every node (module docstring), rescaled by the request's history
        factor when there is one: [N] float32."""
        return self._rescale(pool, self._base_key(pool, index))

    def _base_key(self, pool: TreeBatch, index: PoolIndex | None = None) -> Tensor:
        """``u'`` of the module docstring (no history factor): [N] float32."""
        maps = self.gate.acceptance_maps
        if maps is None:
            return path_score(pool)  # already non-increasing along paths
        return calibrated_key(pool, maps, index)

    def _rescale(self, pool: TreeBatch, value: Tensor) -> Tensor:
        """``min(1, f_r value_i)`` per node of request r; ``value`` unchanged without history."""
        if self._factor is None:
            return value
        return self._rescale_for(pool.request_index(), value)

    def _rescale_for(self, req: Tensor, value: Tensor) -> Tensor:
        """``min(1, f_r value_i)`` for nodes of requests ``req``; unchanged without history."""
        f = self._factor
        if f is None:
            return value
        return (value * f.index_select(0, req)).clamp(max=1.0)

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        d = self.depth
        self.truncated_at = apply_gate(self.gate, pool, d, self.truncated_at)
        active = self.truncated_at > d
        alive = active | (self.truncated_at == d) if self.slack else active  # may be re-admitted
        if self._shallow or d >= self.config.max_depth or not bool(alive.any()):
            return DraftPlan.finished(pool.device)
        grown = self._grown_base(pool, d)
        if grown is not None and not self.reserve_base and self._aged is None:
            plan = self._plan_from_band(pool, grown, active)
            if plan is not None:
                return plan
        ix = PoolIndex.of(pool)
        base = grown if grown is not None else self._base_key(pool, ix)
        key = self._rescale(pool, base)
        k0, width = self.config.topk, self.config.draft_width
        kpos = key_order(key, path_score(pool))
        order = self._order(pool, ix, kpos, key)
        self._memo = _Ranked(pool, ix, base, key, order)  # select reuses it on the same pool
        self._carry = (pool, base, None)  # the band is not tracked on this path
        if self.reserve_base and d < self.config.base_depth:
            at_depth = pool.depth == d
            pick = ranks_in_order(order.group, order.grouped, at_depth & active[ix.req]) < k0
            chosen = pick.nonzero().squeeze(1)
            self._expanded += int(chosen.numel())
            return expand_all(chosen, width)
        budget, caps = self.batch.budget, self.batch.max_nodes
        kept = order.eligible & (order.tier <= DEPTH)
        held = torch.bincount(ix.req[kept], minlength=pool.batch_size)
        full = int(held.sum()) >= budget
        if full or bool((held > caps).any()):  # the budget or a cap binds: allocate for real
            kept = budgeted_select(pool, order.pos, kept, caps, budget, ix)
            held = torch.bincount(ix.req[kept], minlength=pool.batch_size)
            full = int(held.sum()) >= budget
        active = self._readmit(active, full)
        floor = torch.tensor(self.batch.min_utility, device=pool.device)
        if full and self._aged is not None:  # aging's forced rows do not lower the bar
            own = kept & (order.tier != BASE)
            weakest = torch.maximum(key[own].min(), floor) if bool(own.any()) else floor
        else:
            weakest = torch.maximum(key[kept].min(), floor) if full else floor
        if len(ix.by_depth) < d:  # nothing was drafted at depth d
            return DraftPlan.finished(pool.device)
        last = ix.by_depth[d - 1]  # the nodes at depth d, the only ones that may be expanded
        bound, guess = self._child_keys(pool, key.index_select(0, last), last, ix.req[last])
        ok = (kept & (active & (held < caps))[ix.req])[last]
        if full or self.batch.min_utility > 0:
            ok &= bound >= weakest
        if self.batch.node_price:  # each expanded node pays for its drafter row (0: free)
            ok &= guess - weakest > self.batch.node_price
        candidates = torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
        candidates[last] = ok
        nodes = (ranks_in_order(order.group, order.grouped, candidates) < k0).nonzero().squeeze(1)
        node_price = self.batch.node_price or 0.0
        guess_at = torch.zeros_like(key)
        guess_at[last] = guess
        gain = float((guess_at[nodes] - weakest - node_price).clamp(min=0).sum())
        if nodes.numel() == 0 or gain < self._depth_price():
            return DraftPlan.finished(pool.device)
        self._expanded += int(nodes.numel())
        return expand_all(nodes, width)

    def _grown_base(self, pool: TreeBatch, d: int) -> Tensor | None:
        """``u'`` without the history factor (``_base_key``) from this step's previous depth,
        looking up only the depth-d nodes; None when there is no previous depth to grow.

        The pool keeps every older node, in order, and adds depth-d nodes only (``grow_pool``),
        and ``u'`` of a node depends on its own path alone: so the older nodes keep last depth's
        values and a new node gets ``min(m_d(log P), u'_parent)``, its parent found at the same
        request-local index in the previous pool. Depth 1 needs no parent.
        """
        maps = self.gate.acceptance_maps
        if maps is None:
            return path_score(pool)  # already non-increasing along paths
        if d == 1:
            return maps.expected_accept(pool.depth, pool.path_logprob)  # nothing to clamp
        carry = self._carry
        if carry is None:
            return None
        before, prior, _ = carry  # the band is not needed here
        new = (pool.depth == d).nonzero().squeeze(1)
        req = torch.searchsorted(pool.cu_nodes, new, right=True) - 1
        parent = pool.parent.index_select(0, new) + before.cu_nodes.index_select(0, req)
        depth, path = pool.depth.index_select(0, new), pool.path_logprob.index_select(0, new)
        own = maps.expected_accept(depth, path)
        base = torch.empty_like(pool.path_logprob)
        base[pool.depth < d] = prior
        base[new] = torch.minimum(own, prior.index_select(0, parent))
        return base

    def _plan_from_band(self, pool: TreeBatch, base: Tensor, active: Tensor) -> DraftPlan | None:
        """The plan of ``_next_plan`` from the depth-d nodes and the band carried from the
        previous depth; None when that band is unknown (then the full ranking decides).

        Older nodes' band membership (``k0`` best eligible per request and depth) cannot change
        within a step: their keys are fixed, and a gate only truncates below the current depth.
        Every node's parent was expanded, so it is in the band: the band is ancestor-closed and
        ordered ancestors-first by key. So the full ranking's depth tier (tiers 0-1 under the
        budget and the caps) is the band itself when it fits the budget and every cap (the
        weakest selected key is then the floor ``u_min``), else its ``K`` best nodes by key, at
        most ``cap_b`` of request b (:func:`~echo_scheduler.ranking.first_in_order`); and every
        candidate is in its request's band (at most ``k0`` per request and depth). The same
        nodes, in the same order, and the same gain as the full ranking. Not with aging or a
        reserved base (tier 0).
        """
        d, k0, caps, budget = self.depth, self.config.topk, self.batch.max_nodes, self.batch.budget
        carried = self._carry[2] if self._carry is not None else None
        if d > 1 and carried is None:  # the band of earlier depths is unknown
            return None
        last = (pool.depth == d).nonzero().squeeze(1)  # ascending: the full path's order
        req = torch.searchsorted(pool.cu_nodes, last, right=True) - 1
        own = self._rescale_for(req, base.index_select(0, last))
        eligible = self._eligible(d, req, own)
        score = pool.path_logprob.index_select(0, last).to(torch.float32).exp()  # path_score
        band_now = rank_in_group(req, key_order(own, score), eligible) < k0
        held = self._band_held + torch.bincount(req[band_now], minlength=pool.batch_size)
        band = torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
        if carried is not None and d > 1:
            band[pool.depth < d] = carried
        band[last] = band_now
        self._band_held = held
        self._memo = None
        self._carry = (pool, base, band)
        weakest = torch.tensor(self.batch.min_utility, device=pool.device)  # the floor
        kept_now = band_now
        full = int(held.sum()) >= budget
        if full or bool((held > caps).any()):  # the budget or a cap binds: the best band nodes
            every = pool.request_index()
            key = self._rescale_for(every, base)
            idx = band.nonzero().squeeze(1)
            owner = every.index_select(0, idx)
            kpos = key_order(key.index_select(0, idx), path_score(pool).index_select(0, idx))
            top = first_in_order(kpos, owner, caps, budget)
            kept = idx[top]
            held = torch.bincount(owner[top], minlength=len(held))
            full = int(held.sum()) >= budget
            if full:
                weakest = torch.maximum(key.index_select(0, kept).min(), weakest)
            mask = torch.zeros_like(band)
            mask[kept] = True
            kept_now = mask.index_select(0, last)
        active = self._readmit(active, full)
        bound, guess = self._child_keys(pool, own, last, req)
        ok = kept_now & (active & (held < caps)).index_select(0, req)
        if full or self.batch.min_utility > 0:
            ok &= bound >= weakest
        node_price = self.batch.node_price or 0.0
        if self.batch.node_price:  # each expanded node pays for its drafter row (0: free)
            ok &= guess - weakest > self.batch.node_price
        nodes = last[ok]
        gain = float((guess[ok] - weakest - node_price).clamp(min=0).sum())
        if nodes.numel() == 0 or gain < self._depth_price():
            return DraftPlan.finished(pool.device)
        self._expanded += int(nodes.numel())
        return expand_all(nodes, self.config.draft_width)

    def _readmit(self, active: Tensor, full: bool) -> Tensor:
        """``active`` ([B] bool, may draft deeper) with, under ``slack`` and a budget that is
        not ``full`` after this depth's Priority 1, the requests truncated at this depth
        re-admitted (``t_b = Dmax``; module docstring). Their nodes up to this depth were
        eligible either way (``d_i <= d <= t_b``), so only the tiers of a memoised ranking
        (``WIDTH`` for a truncated request) change: it is dropped."""
        if not self.slack or full:
            return active
        fresh = self.truncated_at == self.depth
        if not bool(fresh.any()):
            return active
        self.truncated_at = torch.where(fresh, self.config.max_depth, self.truncated_at)
        self._memo = None
        return active | fresh

    def _child_keys(
        self, pool: TreeBatch, own: Tensor, last: Tensor, req: Tensor
    ) -> tuple[Tensor, Tensor]:
        """For the depth-d nodes ``last`` (global indices, every node at that depth; ``own``
        their keys, ``req`` their requests): an upper bound and an estimate of each one's best
        child's key, [n] float32 each.

        Bound: ``min(u'_f, m_{d+1}(log P_f))`` (a child's path score is at most its parent's;
        maps are non-decreasing). Estimate: the same at ``log P_f + log q_b``, with ``q_b`` the
        request's best draft probability at the depth just drafted (drafter confidence persists).
        Without maps ``m`` is the identity on ``P``. One map lookup for both.
        """
        top = torch.full((pool.batch_size,), -torch.inf, device=pool.device)
        top.scatter_reduce_(0, req, pool.draft_logprob.index_select(0, last), reduce="amax")
        path = pool.path_logprob.index_select(0, last)
        guess_logp = path + top.index_select(0, req).clamp(max=0.0)
        maps = self.gate.acceptance_maps
        if maps is None:
            return own, torch.minimum(own, self._rescale_for(req, guess_logp.exp()))
        n = int(last.numel())
        child = torch.full((2 * n,), self.depth + 1, dtype=torch.int64, device=pool.device)
        both = maps.expected_accept(child, torch.cat([path, guess_logp.clamp(min=-1e4)]))
        bound, guess = self._rescale_for(req, both[:n]), self._rescale_for(req, both[n:])
        return torch.minimum(own, bound), torch.minimum(own, guess)

    def _eligible(self, depth: Tensor | int, req: Tensor, key: Tensor) -> Tensor:
        """Eligibility of nodes at ``depth`` of requests ``req`` with keys ``key``: ``d_i <= t_b``
        and, under a cost floor, ``u'_i >= u_min``. [n] bool."""
        eligible = self.truncated_at.index_select(0, req) >= depth
        if self.batch.min_utility > 0:
            eligible &= key >= self.batch.min_utility
        return eligible

    def _order(self, pool: TreeBatch, ix: PoolIndex, kpos: Tensor, key: Tensor) -> _Order:
        """Tiers and the selection priority of the module docstring (two sorts in all)."""
        eligible = self._eligible(pool.depth, ix.req, key)
        group = ix.req * (self.config.max_depth + 1) + pool.depth.clamp(max=self.config.max_depth)
        grouped = group_order(group, kpos)
        forced = self._forced(pool, ix, group, grouped)
        if forced is not None:
            eligible |= forced
        band = ranks_in_order(group, grouped, eligible) < self.config.topk
        tier = torch.where(self.truncated[ix.req], WIDTH, REINVEST)
        tier = torch.where(band, DEPTH, tier)
        if self.reserve_base:
            n0 = torch.full_like(self.truncated_at, self.config.tree_nodes)
            shallow = pool.depth <= self.config.base_depth
            base = top_per_request(pool, kpos, n0, shallow) & eligible
            tier = torch.where(base, BASE, tier)
        if forced is not None:
            tier = torch.where(forced, BASE, tier)
        by_key = inverse(kpos)
        ranked = tier[by_key]
        perm = by_key[torch.sort(ranked, stable=True).indices]  # tier-major, key order within
        return _Order(inverse(perm), eligible, tier, group, grouped)

    def _forced(
        self, pool: TreeBatch, ix: PoolIndex, group: Tensor, grouped: Tensor
    ) -> Tensor | None:
        """[N] bool: the best depth-1 node of every aged request (None: no request is aged)."""
        aged = self._aged
        if aged is None:
            return None
        first = pool.depth == 1
        return first & aged[ix.req] & (ranks_in_order(group, grouped, first) == 0)

    def select(self, pool: TreeBatch) -> Tensor:
        ranked = self._memo if self._memo is not None and self._memo.pool is pool else None
        self._memo = None
        keep: Tensor | None = None
        if ranked is None:  # the last depth did not rank this pool: the band, else rank it now
            carry = self._carry
            carried = carry if carry is not None and carry[0] is pool else None
            base = carried[1] if carried is not None else self._base_key(pool)
            key = self._rescale(pool, base)
            if self._aged is None and not self.reserve_base:
                keep = self._select_in_tiers(pool, key, carried[2] if carried else None)
            if keep is None:
                ix = PoolIndex.of(pool)
                kpos = key_order(key, path_score(pool))
                ranked = _Ranked(pool, ix, base, key, self._order(pool, ix, kpos, key))
        else:
            base, key = ranked.base, ranked.key
        order = ranked.order if ranked is not None else None  # None: nothing is aged
        if ranked is not None:
            caps, budget = self.batch.max_nodes, self.batch.budget
            pos, eligible = ranked.order.pos, ranked.order.eligible
            keep = budgeted_select(pool, pos, eligible, caps, budget, ranked.ix)
        assert keep is not None  # the band or the ranking selected
        price = self.batch.row_price
        if price is not None and self.gate.acceptance_maps is not None:
            if self._aged is None or order is None:
                keep = exact_cut(key, keep, pool.batch_size, price)  # keys are acceptances here
            else:  # aging's rows pass the cut, and the cut counts them as already verified
                forced = keep & (order.tier == BASE)
                verified = pool.batch_size + int(forced.sum())  # roots and forced rows
                keep = exact_cut(key, keep & ~forced, verified, price) | forced
        if self._factor is not None:  # what the unscaled keys predicted for the verified nodes
            weights = torch.where(keep, base, 0.0).to(torch.float64)
            self._predicted = torch.zeros(pool.batch_size, dtype=torch.float64, device=pool.device)
            self._predicted.index_add_(0, pool.request_index(), weights)
        return keep

    def _select_in_tiers(self, pool: TreeBatch, key: Tensor, band: Tensor | None) -> Tensor | None:
        """``select``'s nodes without the full ranking, or None without the step's band.

        Eligibility (``d_i <= t_b`` and ``u'_i >= u_min``) is ancestor-closed, as ``u'`` never
        rises along a path. When every eligible node fits the budget, the budgeted selection in
        any order keeps all of them. Else, with the step's band (``band``, carried from the last
        depth; None: unknown, then None), the (tier, key) order is ancestors-first: a band
        node's ancestors are band nodes with keys at least its own, and every other eligible
        node's parent was expanded, so is in the band. The selection is then the first ``K``
        eligible nodes in that order, at most ``cap_b`` of request b (its first in that order).
        """
        req = pool.request_index()
        eligible = self._eligible(pool.depth, req, key)
        held = torch.bincount(req[eligible], minlength=pool.batch_size)
        caps = self.batch.max_nodes
        if int(held.sum()) <= self.batch.budget and not bool((held > caps).any()):
            return eligible
        if band is None:
            return None
        idx = eligible.nonzero().squeeze(1)
        owner = req.index_select(0, idx)
        kpos = key_order(key.index_select(0, idx), path_score(pool).index_select(0, idx))
        other = torch.where(self.truncated.index_select(0, owner), WIDTH, REINVEST)
        tier = torch.where(band.index_select(0, idx), DEPTH, other)
        pos = positions(tier * idx.numel() + kpos)
        keep = torch.zeros_like(eligible)
        keep[idx[first_in_order(pos, owner, caps, self.batch.budget)]] = True
        return keep

    def tiers(self, pool: TreeBatch) -> Tensor:
        """Tier of every node for the current step state (-1 = not eligible): [N] int64."""
        ix = PoolIndex.of(pool)
        key = self.key(pool, ix)
        order = self._order(pool, ix, key_order(key, path_score(pool)), key)
        return torch.where(order.eligible, order.tier, -1)


EXPLORE_HASH = 0x9E3779B1
"""Multiplier of the explore sample's hash of a request serial (Fibonacci hashing, mod 2^32)."""


def explore_sample(batch: StepBatch, live: Tensor, roots: int) -> Tensor:
    """The ``roots`` live requests (``live`` [B] bool) whose serials hash lowest,
    ``h(s) = (s * EXPLORE_HASH) mod 2^32``, as a [B] bool mask on ``live``'s device; the first
    ``roots`` live ones in batch order when the step has no serials. A request keeps its place
    in the sample for as long as it lives and no lower hash arrives, so the head catches up the
    same few requests step after step (module docstring: sampled exploration)."""
    live_host = live.cpu()
    if batch.requests is None:
        order = torch.arange(live_host.numel())
    else:
        order = (batch.requests * EXPLORE_HASH) % (1 << 32)
    order = torch.where(live_host, order, torch.iinfo(torch.int64).max)
    chosen = torch.zeros_like(live_host)
    chosen[torch.argsort(order, stable=True)[:roots]] = True
    return (chosen & live_host).to(live.device)


def priced(batch: StepBatch) -> bool:
    """The engine passed a cost floor (elastic K): rows and drafting have prices."""
    return batch.min_utility > 0 or bool(batch.node_price) or bool(batch.depth_price)


def depth_price(batch: StepBatch, config: PolicyConfig) -> float:
    """Tokens one more drafter call must promise: the engine's price, else the config's
    ``min_depth_gain``."""
    return config.min_depth_gain if batch.depth_price is None else batch.depth_price


def calibrated_key(pool: TreeBatch, maps: AcceptanceMaps, index: PoolIndex | None = None) -> Tensor:
    """``u'_i = min(m_{d_i}(log P_i), u'_parent)``: every node's calibrated acceptance estimate,
    never above an ancestor's ([N] float32; :func:`~echo_scheduler.ranking.monotone_key`)."""
    return monotone_key(pool, maps.expected_accept(pool.depth, pool.path_logprob), index)


def best_first_value(maps: AcceptanceMaps, device: torch.device) -> float:
    """``m_1(0)``: the most a depth-1 node can be worth (a path score of 1)."""
    one = torch.ones(1, dtype=torch.int64, device=device)
    return float(maps.expected_accept(one, torch.zeros(1, device=device))[0])


def first_depth_pays(best: float, batch: StepBatch, live: int, depth_price: float) -> bool:
    """The floor's pre-check: can drafting depth 1 pay at all? ``best`` (at most ``m_1(0)``) less
    the row floor ``u_min`` and the node price is what one root's children can bring (siblings
    exclude each other: at most one token between them); it must be positive, and the ``live``
    roots together must cover the drafter call's ``depth_price`` (tokens)."""
    per_root = best - batch.min_utility - (batch.node_price or 0.0)
    return per_root > 0 and live * per_root >= depth_price


@dataclass(frozen=True, slots=True)
class _Ranked:
    """A pool's ranking as ``_next_plan`` computed it; the gate state it depends on (truncation,
    aging, the floor) does not change between the last depth and ``select``."""

    pool: TreeBatch
    ix: PoolIndex
    base: Tensor  # [N] float32, u' without the history factor
    key: Tensor  # [N] float32, u' rescaled
    order: _Order


@dataclass(frozen=True, slots=True)
class _Order:
    pos: Tensor  # [N] int64 permutation: (tier, key desc, path score desc, index)
    eligible: Tensor  # [N] bool, depth <= t_b
    tier: Tensor  # [N] int64
    group: Tensor  # [N] int64, request * (Dmax + 1) + depth
    grouped: Tensor  # [N] int64, nodes sorted by (group, key order)
