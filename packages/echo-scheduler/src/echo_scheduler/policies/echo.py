"""ECHO: sparse confidence gating and an elastic two-priority allocation of one budget K.

Key. ``u_i = m_{d_i}(log P_i)`` with the gate's calibrated acceptance maps (the estimated
P(node accepted), its marginal utility), else the path score ``P_i``; then
``u'_i = min(u_i, u'_parent)`` so the key never rises along a path. Ties (the maps are step
functions) go to the higher path score, then the lower index.

Gates (echo_scheduler.gating). At a checkpoint d (``gate.is_checkpoint(d)``) a request whose
layer confidence ``C_b(d) < tau_d`` is truncated at ``t_b = d``: it drafts no deeper this step
and none of its nodes deeper than d is ever selected (``t_b = Dmax`` while not truncated).
A node is eligible when ``d_i <= t_b`` and, under a cost floor, ``u'_i >= u_min``.

Tiers over the eligible nodes, taken in order (tier, key desc):

- depth (Priority 1): per request and depth its ``k0`` best nodes (the band, EAGLE-2's);
- width (Priority 2): every other node of a truncated request (its extra siblings);
- reinvest (low contention): every other node.

The selection takes them in that order until K nodes, at most ``max_nodes[b]`` per request: no
truncated request is widened while a Priority-1 node is left; with surplus the trees grow
deeper, then wider. The selection for K is a subset of the one for K + 1 on the same pool, and
with K >= every eligible node all of them are selected.

Drafting. Every expanded node is drafted into ``W = max(k0, Wmax)`` children, so the pool holds
the siblings width may take. After depth d, each request not truncated expands its band's
depth-d nodes that the depth tier selects under the budget and the caps and whose children
could still be selected: ``min(u'_f, m_{d+1}(log P_f))`` (an upper bound of any child's key)
must reach the key ``w`` of the weakest selected node (``w = u_min`` while the budget is not
full) and, for a request holding its cap ``cap_b``, the key ``w_b`` of its own weakest selected
node (a child would displace it). So a cap binds as the budget does: at B = 1 a cap of K
decides exactly as K (before 2026-12-06 a request at its cap stopped drafting, which inside
SGLang, whose per-request cap is N - 1, kept ECHO's trees at depth 2). Drafting stops when no
node qualifies or when the depth's estimated gain ``sum_f max(0, c_f - max(w, w_b) - node
price)`` (``c_f``: estimated best-child key, ``_child_keys``) is below the price of one more
drafter call (``batch.depth_price``, else ``config.min_depth_gain``).

Elastic floor and cut. The engine may pass ``batch.min_utility = u_min``, the acceptance a node
needs to pay for its verify row: with ``R`` the step's throughput and ``dt`` the marginal verify
latency of one more row, ``d/dk [(B + G(k)) / t(B + k)] >= 0`` iff ``u_k >= R dt``
(echo_scheduler.elastic); ``batch.node_price`` is what an expanded node must promise beyond
``w``. Pre-check: if no depth-1 node could pay its row (``m_1(0) - u_min - node price <= 0``,
or the live roots together not the depth price: a root's children bring at most one token
between them) the step is not drafted: under saturation ECHO decodes plainly at no drafting
cost. With ``batch.row_price`` (and maps) the selection is finally cut to the rows worth their
verify time at this step's size (:func:`echo_scheduler.cut.exact_cut`): the floor prices a row
from recent steps, the cut from the rows actually selected.

Ledger and modes. The pre-check is optimistic, so a priced ECHO keeps
:class:`~echo_scheduler.ledger.DraftLedger` s of what its drafted steps returned net of every
row, expansion and call at their prices, one for full drafting and one for depth 1 only (one
drafter call, the roots' children, priced and cut as usual); each step takes the mode whose
ledger promises more, probing the other on a doubling clock, and decodes plainly only while both
say drafting loses (:class:`~echo_scheduler.ledger.ModeChooser`). Replay on the CPU profile, 80
composed steps per cell (docs/BENCHMARKS.md, 2026-12-02): the depth-1 mode +4.0% on mtbench at
B = 1 and +1.7% on summarize at B = 4, -0.7 / -0.8% at B = 16.

Exploration. ``batch.explore_rows = m > 0`` (with maps and prices) says the engine's cost model
has not timed the step's next ``m`` row counts (echo_scheduler.elastic, engine/cost_feedback.py).
If the pre-check has refused ``EXPLORE_AFTER`` steps in a row, or ECHO has drafted that many
steps in a row, while they stay untimed, the prices may be what is wrong, and row counts no one
verifies never correct them: the next such step is drafted at depth 1 (mode ``explore``, not
recorded in a ledger, whose prices are the ones in doubt), no node is held back by ``u_min``,
and it verifies exactly its ``m`` best rows (:func:`~echo_scheduler.cut.best_rows`). Prices that
refuse every row (a profile too dear) thus get rows timed; prices that pay for many rows (a
profile pricing rows as free, which kept ECHO verifying 16 rows at c = 8, its one timed row
count, and 7% behind a clean start on the AMD EPYC VM) get the few-row counts timed, and with
them the slope. Refusals by the ledger (drafting measured as a loss) never explore: forcing rows
whenever they were untimed cost 1-2.4% at c = 8 on MT-Bench (docs/BENCHMARKS.md).

Cost. Within a step nothing about an older node changes: its key, and whether it is in its
request's band (eligibility of depths <= d is fixed once depth d is drafted). So each depth
looks up keys for its new nodes only (``_grown_base``) and extends the band carried from the
last depth (``_carry``); the plan and ``select`` decide from those. Every parent was expanded,
so it is in the band: band and eligibility are ancestor-closed and the (tier, key) order lists
ancestors first, so the selection is each request's first ``cap_b`` eligible nodes in that
order, then the first K of those (:func:`~echo_scheduler.ranking.first_in_order`), with no
tree-aware pass (a depth after which drafting stops leaves its band to ``select``, which ranks
the pool whole only when the budget or a cap binds). A hypothesis test pins this to the full
ranking (tier order + :func:`~echo_scheduler.ranking.budgeted_select`) bit for bit. What the
ranking costs on a GPU: docs/BENCHMARKS.md, 2026-12-04.

Host syncs (each one a stall on a GPU). Per step: the live request count. Per drafted depth:
one read of three flags (a request still active, the budget full, a request at its cap) and one
``nonzero`` for the nodes to expand, whose count sizes the drafter's call; one more ``nonzero``
over the band when the budget or a cap binds. The depth's new nodes are the ones the previous
pool lacked (a count the host knows: ``nonzero_static``); the selection and its exact cut make
none (a mask where a gather would need a count). On the recorded pools that is 6-15 syncs per
step at B = 16-256, against 21-74 before 2026-12-06 (packages/echo-lab/scripts/policy_syncs.py).
Fewer needs drafting of a fixed shape: ``echo_device`` (echo_scheduler.device) makes the same
decisions over a fixed layout (every depth a [B, n_d] slab of slots, a padded [B, k0] frontier)
with no host sync at all; a drafter that drafts that layout needs no count from the policy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.maps import AcceptanceMaps
from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cut import best_rows, exact_cut
from echo_scheduler.gating import apply_gate
from echo_scheduler.interface import BasePolicy, DraftPlan, StepBatch, StepOutcome
from echo_scheduler.ledger import DraftedStep, DraftLedger, ModeChooser
from echo_scheduler.policies.frontier import expand_all
from echo_scheduler.pool import older_index
from echo_scheduler.ranking import (
    PoolIndex,
    budgeted_select,
    first_in_order,
    key_order,
    monotone_key,
    path_score,
    positions,
    rank_in_group,
)

EXPLORE_AFTER = 4
"""Pre-check refusals, or drafted steps, in a row while the next row counts are untimed before
a step explores (module docstring): one step in five, the ledger's shortest probe period."""

DEPTH, WIDTH, REINVEST = 0, 1, 2
"""Selection tiers, taken in this order."""

STEP_MODES = ("floor", "plain", "shallow", "full", "explore")
"""How a priced step was decided (``EchoPolicy.step_modes`` counts them): ``floor``, the
pre-check (with maps) found no depth-1 draft worth its row, so plain decoding; else the mode
chooser's ``plain``, ``shallow`` (depth 1 only) or ``full``; ``explore``: the cost model's
exploration (module docstring)."""


class EchoPolicy(BasePolicy):
    """ECHO (module docstring); the gate's mode makes its ablations (dense, fixed, none)."""

    learns_drafting = True
    """Keep the ledgers and the mode chooser (False: ``echo_noledger``, the ablation)."""

    sync_free: bool | None = None
    """Whether ``select`` avoids host reads it could skip work with: None decides by the pool's
    device (a read is free on the CPU, a stall on a GPU); True always (the device path, which
    the tests run on the CPU too); False never."""

    def __init__(
        self, config: PolicyConfig, gate: GatePolicy | None = None, name: str = "echo"
    ) -> None:
        super().__init__()
        self.config = config
        self.gate = gate if gate is not None else GatePolicy.none()
        self._step_gate = self.gate  # the gate of the current step (set_gate waits for the next)
        self.name = name
        self.ledger = DraftLedger() if self.learns_drafting else None  # full drafting
        self.shallow_ledger = DraftLedger() if self.learns_drafting else None  # depth 1 only
        self.modes = (
            None
            if self.ledger is None or self.shallow_ledger is None
            else ModeChooser(self.ledger, self.shallow_ledger)
        )
        self._shallow = False  # this step drafts depth 1 only
        self.truncated_at = torch.zeros(0, dtype=torch.int64)  # [B], Dmax = never truncated
        self._live = 0  # this step's requests allowed to draft
        self._roots = self._expanded = 0  # roots expanded under the ledger; deeper nodes
        self._plain_draft_s: float | None = None  # d_0: undrafted steps' draft phase, seconds
        self.step_modes: dict[str, int] = dict.fromkeys(STEP_MODES, 0)  # priced steps per mode
        self._refusals = 0  # pre-check refusals in a row
        self._untimed = 0  # drafted steps in a row while the next row counts are untimed
        self._exploring = False  # this step explores (module docstring)
        self._first_best: tuple[AcceptanceMaps, float] | None = None  # maps -> m_1(0)
        self._band_held = torch.zeros(0, dtype=torch.int64)  # [B] band nodes per request
        self._carry: tuple[TreeBatch, Tensor, Tensor] | None = None  # pool, u', band
        self._unbanded: TreeBatch | None = None  # the last depth's pool, if its band is not out

    def active_gate(self) -> GatePolicy:
        return self.gate

    def set_gate(self, gate: GatePolicy) -> bool:
        """Swap in recalibrated gates from the next step on (the engine does it between steps;
        within a step, keys and band carried from one depth to the next share one gate)."""
        self.gate = gate
        return True

    def _start(self, batch: StepBatch) -> None:
        self._step_gate = self.gate
        self.truncated_at = torch.where(batch.max_nodes > 0, self.config.max_depth, 0)
        self._roots = self._expanded = 0
        self._band_held = torch.zeros_like(batch.max_nodes)  # band nodes per request so far
        self._carry = self._unbanded = None
        self._exploring = False

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        return DraftPlan.roots(torch.where(batch.max_nodes > 0, self._root_width(batch), 0))

    def _root_width(self, batch: StepBatch) -> int:
        """How many children of each live root to draft this step (0: plain decoding): the
        pre-check, exploration and the mode chooser (module docstring), decided on the host."""
        width = self.config.draft_width
        maps = self._step_gate.acceptance_maps
        is_priced = priced(batch)
        live = int((batch.max_nodes > 0).sum())
        self._live = live
        if maps is not None and is_priced:
            best = self._best_first(maps, batch.max_nodes.device)
            if first_depth_pays(best, batch, live, self._depth_price()):
                self._refusals = 0
            else:
                self._refusals += 1
                if batch.explore_rows and width and live and self._refusals > EXPLORE_AFTER:
                    return self._explore(width)
                width = 0  # not even the best depth-1 draft pays for its rows: plain decoding
                self.step_modes["floor"] += 1
        probing = maps is not None and is_priced and width > 0 and batch.explore_rows > 0
        if probing and self._untimed >= EXPLORE_AFTER:  # drafted this often, still untimed
            return self._explore(width)
        self._shallow = False
        if width and is_priced and self.modes is not None:
            mode = self.modes.choose(live, self._depth_price())
            self._shallow = mode == "shallow"  # depth 1 paid more lately
            if mode == "plain":
                width = 0  # drafting lost lately at this load: plain decoding (probes aside)
            self._roots = live if width else 0  # a drafted step the ledger will record
            self.step_modes[mode] += 1
        if not batch.explore_rows:
            self._untimed = 0
        elif probing and width:
            self._untimed += 1
        return width

    def _explore(self, width: int) -> int:
        """This step explores (module docstring): depth 1, its best ``explore_rows`` rows."""
        self._refusals = self._untimed = 0
        self._exploring, self._shallow, self._roots = True, True, 0  # no ledger (docstring)
        self.step_modes["explore"] += 1
        return width

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
        """Fold a priced, drafted step's realised value into its mode's ledger."""
        batch = self._batch
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

    def key(self, pool: TreeBatch) -> Tensor:
        """``u'`` of every node (module docstring): [N] float32."""
        maps = self._step_gate.acceptance_maps
        if maps is None:
            return path_score(pool)  # already non-increasing along paths
        return calibrated_key(pool, maps)

    def _next_plan(self, pool: TreeBatch) -> DraftPlan:
        """Which depth-d nodes to expand (module docstring: drafting). Host syncs: one read of
        three flags (a request still active, the budget full, a request at its cap), one ``nonzero``
        for the nodes to expand (their count sizes the drafter call), and one more ``nonzero``
        over the band only when the budget or a cap binds."""
        d, caps, budget = self.depth, self.batch.max_nodes, self.batch.budget
        self.truncated_at = apply_gate(self._step_gate, pool, d, self.truncated_at)
        active = self.truncated_at > d
        if self._shallow or d >= self.config.max_depth:
            self._unbanded = pool  # select extends the band to it
            return DraftPlan.finished(pool.device)
        key, band, last, req = self._extend_band(pool, d)
        # the depth tier under the budget and the caps: the band when it fits (the weakest
        # selected key is then the floor), else its K best nodes, at most cap_b of request b
        held = self._band_held
        at_cap = (held >= caps) & (held > 0)
        flags = torch.stack([active.any(), held.sum() >= budget, at_cap.any()])
        any_active, full, binds = flags.tolist()
        if not any_active:
            return DraftPlan.finished(pool.device)
        floor = torch.tensor(self.batch.min_utility, device=pool.device)
        weakest, filled = floor, torch.zeros((), dtype=torch.bool, device=pool.device)
        own_weakest: Tensor | None = None  # w_b per depth-d node, where a request holds its cap
        kept_now = band.index_select(0, last)
        if full or binds:
            idx = band.nonzero().squeeze(1)
            owner = pool.request_index().index_select(0, idx)
            own = key.index_select(0, idx)
            kpos = key_order(own, path_score(pool).index_select(0, idx))
            top = first_in_order(kpos, owner, caps, budget)
            held = torch.zeros_like(held).index_add_(0, owner, top.to(torch.int64))
            filled = held.sum() >= budget
            kept_keys = torch.where(top, own, torch.inf)
            least = kept_keys.min()  # the weakest kept key
            weakest = torch.where(filled, torch.maximum(least, floor), floor)
            if binds:
                at_cap_keys = self._weakest_at_cap(kept_keys, owner, held, caps)
                own_weakest = at_cap_keys.index_select(0, req)
            kept_now = torch.zeros_like(band).index_copy_(0, idx, top).index_select(0, last)
        bound, guess = self._child_keys(pool, key.index_select(0, last), last, req)
        ok = kept_now & active.index_select(0, req)
        if self.batch.min_utility > 0:
            ok &= bound >= weakest
        else:
            ok &= (bound >= weakest) | ~filled
        if own_weakest is not None:  # a request at its cap: a child must beat its weakest node
            ok &= bound >= own_weakest
            weakest = torch.maximum(weakest, own_weakest)  # what an expanded child displaces
        node_price = self.batch.node_price or 0.0
        if self.batch.node_price:  # each expanded node pays for its drafter row (0: free)
            ok &= guess - weakest > self.batch.node_price
        gain = torch.where(ok, guess - weakest - node_price, 0.0).clamp(min=0)
        gain = gain.double().sum()  # in float64, as echo_device sums it over padded rows
        pays = gain >= self._depth_price()  # else the depth does not pay its drafter call
        nodes = last.index_select(0, (ok & pays).nonzero().squeeze(1))
        if nodes.numel() == 0:
            return DraftPlan.finished(pool.device)
        self._expanded += int(nodes.numel())
        return expand_all(nodes, self.config.draft_width)

    @staticmethod
    def _weakest_at_cap(kept_keys: Tensor, owner: Tensor, held: Tensor, caps: Tensor) -> Tensor:
        """[B] float32: ``w_b = min key of request b's kept band nodes`` where b holds its cap
        (``held_b >= cap_b``), else ``-inf``. A request at its cap still expands a kept node
        whose children's bound reaches ``w_b``: such a child could displace the request's
        weakest kept node in the selection, the rule a full budget applies with ``w``."""
        least = torch.full(held.shape, torch.inf, dtype=kept_keys.dtype, device=held.device)
        least = least.scatter_reduce(0, owner, kept_keys, reduce="amin")
        return torch.where(held >= caps, least, -torch.inf)

    def _extend_band(self, pool: TreeBatch, d: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Carry keys and band to depth d (``_carry``, ``_band_held``); returns ``u'`` and the
        band of every node ([N] each), the depth-d nodes (global indices, ascending) and their
        requests.

        A depth-d node is in the band when it is among its request's ``k0`` best eligible
        depth-d nodes; older nodes keep their membership (module docstring: cost). Without a
        carry from depth d - 1 the older nodes are ranked from scratch."""
        carry = self._carry
        last = self._depth_nodes(pool, d)  # ascending: the full ranking's order
        req = torch.searchsorted(pool.cu_nodes, last, right=True) - 1
        key = self._grown_base(pool, d, last, req)
        band = torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
        if d > 1 and carry is None:  # rank the older depths from scratch
            every = pool.request_index()
            older = (pool.depth < d) & self._eligible(pool.depth, every, key)
            band = self._band(pool, key, older)
            self._band_held = torch.zeros_like(self._band_held).index_add_(0, every, band.long())
        elif d > 1 and carry is not None:
            band.index_copy_(0, older_index(pool, carry[0]), carry[2])
        own = key.index_select(0, last)
        score = pool.path_logprob.index_select(0, last).to(torch.float32).exp()  # path_score
        eligible = self._eligible(d, req, own)
        band_now = rank_in_group(req, key_order(own, score), eligible) < self.config.topk
        band.index_copy_(0, last, band_now)
        self._band_held = self._band_held.index_add(0, req, band_now.to(torch.int64))
        self._carry = (pool, key, band)
        return key, band, last, req

    def _depth_nodes(self, pool: TreeBatch, d: int) -> Tensor:
        """The depth-d nodes of ``pool`` (global indices, ascending), without a host sync where
        their count is known: every node at depth 1, and past it the nodes the last depth's
        pool (the carry) did not have (``grow_pool`` adds depth-d nodes only)."""
        if d == 1:
            return torch.arange(pool.num_nodes, dtype=torch.int64, device=pool.device)
        carry = self._carry
        if carry is None:  # a pool this policy did not draft depth by depth: count them
            return (pool.depth == d).nonzero().squeeze(1)
        added = pool.num_nodes - carry[0].num_nodes
        return torch.nonzero_static(pool.depth == d, size=added).squeeze(1)

    def _grown_base(self, pool: TreeBatch, d: int, new: Tensor, req: Tensor) -> Tensor:
        """``u'`` of every node (:meth:`key`), from this step's previous depth when it is carried,
        looking up only the depth-d nodes.

        The pool keeps every older node, in order, and adds depth-d nodes only (``grow_pool``),
        and ``u'`` of a node depends on its own path alone: so the older nodes keep last depth's
        values and a new node gets ``min(m_d(log P), u'_parent)``, its parent found at the same
        request-local index in the previous pool. Depth 1 needs no parent. ``new``: the depth-d
        nodes (global indices, ascending), ``req`` their requests.
        """
        maps = self._step_gate.acceptance_maps
        if maps is None:
            return path_score(pool)  # already non-increasing along paths
        if d == 1:
            return maps.expected_accept(pool.depth, pool.path_logprob)  # nothing to clamp
        carry = self._carry
        if carry is None:
            return calibrated_key(pool, maps)
        before, prior, _ = carry
        parent = pool.parent.index_select(0, new) + before.cu_nodes.index_select(0, req)
        depth, path = pool.depth.index_select(0, new), pool.path_logprob.index_select(0, new)
        own = maps.expected_accept(depth, path)
        base = torch.empty_like(pool.path_logprob)
        base.index_copy_(0, older_index(pool, before), prior)
        base.index_copy_(0, new, torch.minimum(own, prior.index_select(0, parent)))
        return base

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
        maps = self._step_gate.acceptance_maps
        if maps is None:
            return own, torch.minimum(own, guess_logp.exp())
        n = int(last.numel())
        child = torch.full((2 * n,), self.depth + 1, dtype=torch.int64, device=pool.device)
        both = maps.expected_accept(child, torch.cat([path, guess_logp.clamp(min=-1e4)]))
        return torch.minimum(own, both[:n]), torch.minimum(own, both[n:])

    def _eligible(self, depth: Tensor | int, req: Tensor, key: Tensor) -> Tensor:
        """Eligibility of nodes at ``depth`` of requests ``req`` with keys ``key``: ``d_i <= t_b``
        and, under a cost floor, ``u'_i >= u_min``. [n] bool."""
        eligible = self.truncated_at.index_select(0, req) >= depth
        if self.batch.min_utility > 0 and not self._exploring:
            eligible &= key >= self.batch.min_utility
        return eligible

    def _band(self, pool: TreeBatch, key: Tensor, mask: Tensor) -> Tensor:
        """[N] bool: each request's ``k0`` best ``mask`` nodes per depth, in key order."""
        dmax = self.config.max_depth
        group = pool.request_index() * (dmax + 1) + pool.depth.clamp(max=dmax)
        return rank_in_group(group, key_order(key, path_score(pool)), mask) < self.config.topk

    def _tier(self, pool: TreeBatch, key: Tensor, eligible: Tensor) -> Tensor:
        """[N] int64: every node's tier (module docstring), eligible or not."""
        tier = torch.where(self.truncated[pool.request_index()], WIDTH, REINVEST)
        return torch.where(self._band(pool, key, eligible), DEPTH, tier)

    def tiers(self, pool: TreeBatch) -> Tensor:
        """Tier of every node for the current step state (-1 = not eligible): [N] int64."""
        key = self.key(pool)
        eligible = self._eligible(pool.depth, pool.request_index(), key)
        return torch.where(eligible, self._tier(pool, key, eligible), -1)

    def select(self, pool: TreeBatch) -> Tensor:
        carry = self._carry
        if carry is not None and carry[0] is pool:
            key, band = carry[1], carry[2]
        elif self._unbanded is pool and self.depth >= 1 and self._sync_free(pool):
            key, band, _, _ = self._extend_band(pool, self.depth)  # drafting stopped before it
        else:  # not drafted by this policy this step, or on the CPU (ranked only if it binds)
            key, band = self.key(pool), None
        keep = self._select_in_tiers(pool, key, band)
        price = self.batch.row_price
        if price is not None and self._step_gate.acceptance_maps is not None:
            if self._exploring:
                return best_rows(key, keep, self.batch.explore_rows, path_score(pool))
            gather = not self._sync_free(pool)
            keep = exact_cut(key, keep, pool.batch_size, price, gather)
        return keep

    def _sync_free(self, pool: TreeBatch) -> bool:
        """:attr:`sync_free` for ``pool``."""
        return pool.device.type != "cpu" if self.sync_free is None else self.sync_free

    def _select_in_tiers(self, pool: TreeBatch, key: Tensor, band: Tensor | None) -> Tensor:
        """The eligible nodes in (tier, key) order under the caps and the budget.

        Eligibility (``d_i <= t_b`` and ``u'_i >= u_min``) is ancestor-closed, as ``u'`` never
        rises along a path. With the step's band (``band``, carried depth by depth and extended
        to the last one), the (tier, key) order is ancestors-first: a band node's ancestors are
        band nodes with keys at least its own, and every other eligible node's parent was
        expanded, so is in the band. The selection is then the first ``K`` eligible nodes in
        that order, at most ``cap_b`` of request b (its first in that order): one sort of the
        pool with the ineligible nodes last, ranks and a running count, fixed shape and no host
        sync (:func:`~echo_scheduler.ranking.first_in_order` under a mask). When every eligible
        node fits, that is every eligible node: on the CPU, where reading a count costs nothing,
        that case is checked first and skips the sorts (on the recorded pools the dense ranking
        alone put ECHO's host time 10-30% up at B = 256). Without the band (a pool this policy
        did not draft this step) the whole pool is ranked and :func:`budgeted_select` keeps
        parents first, its cost paid only when the budget or a cap binds.
        """
        req = pool.request_index()
        eligible = self._eligible(pool.depth, req, key)
        caps, budget = self.batch.max_nodes, self.batch.budget
        score = path_score(pool)
        if band is None or not self._sync_free(pool):  # a host read is free on the CPU
            held = torch.zeros_like(caps).index_add_(0, req, eligible.to(torch.int64))
            if not bool((held.sum() > budget) | (held > caps).any()):
                return eligible  # what the ranking below keeps when nothing binds
        if band is not None:
            other = torch.where(self.truncated.index_select(0, req), WIDTH, REINVEST)
            tier = torch.where(eligible, torch.where(band, DEPTH, other), REINVEST + 1)
            pos = positions(tier * pool.num_nodes + key_order(key, score))
            return first_in_order(pos, req, caps, budget, eligible)
        kpos = key_order(key, score)
        pos = positions(self._tier(pool, key, eligible) * pool.num_nodes + kpos)
        return budgeted_select(pool, pos, eligible, caps, budget)


class NoLedgerEchoPolicy(EchoPolicy):
    """``echo_noledger``: ECHO without its ledgers and mode chooser, drafting whenever the
    optimistic pre-check lets it (what ECHO was before the ledger). An ablation: in the replay
    it runs at 0.976x of ECHO on mtbench at B = 16 on the CPU profile and at 0.991-1.028x on the
    GPU cost models (docs/BENCHMARKS.md, 2026-12-02/03)."""

    learns_drafting = False


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
