"""Elastic K: the per-step cost floor on a node's utility, from a verify-cost model and feedback.

A step over B requests that verifies k draft rows emits ``B + G(k)`` tokens in
``t(B + k) + o`` seconds (``G``: expected accepted drafts, the sum of the selected nodes'
utilities; ``o``: the step's other work: drafting, selection, acceptance, commit). The step's
throughput ``R(k) = (B + G(k)) / (t(B + k) + o)`` grows with one more row of utility ``u`` iff

    u >= R * dt,   dt = t(B + k + 1) - t(B + k)   (the row's marginal verify latency)

so ``u_min = R * dt`` is the *cost floor*: nodes below it cost more time than they earn. In the
same currency one more drafter call (``t_d`` seconds) must promise ``R * t_d`` tokens: the depth
price; once steps report their expansions, drafting is split into ``c_call`` per call and
``c_node`` per expanded node (:meth:`ElasticFloor.draft_split`), and the depth price becomes
``R c_call`` with a node price ``R c_node`` that each expanded node must promise. Both change
every step with the batch size and the load, which is what makes K elastic: at batch 1 on a
memory-bound device ``dt`` is tiny and the floor is low; at saturation
(compute-bound, ``dt ~ t(T)/T``) it rises to about one accepted token per request-row, and a
policy honouring it (ECHO) stops drafting and decodes plainly.

:class:`ElasticFloor` keeps exponential moving averages (weight ``alpha``) of what the engine
observes per step: tokens emitted per request ``m``, draft rows verified per request ``v``, the
other work ``o`` (seconds per step), drafter seconds per drafted depth ``t_d``, and the ratio
``s`` of measured to modelled verify latency (the model is a profile taken once; ``s`` follows
contention and drift; one scale cannot fix a profile of the wrong shape, so the engine also
corrects the curve itself per row count from live steps, echo_scheduler.live_cost, and hands the
corrected curve to :meth:`ElasticFloor.recalibrate`). For a step over B requests it then
evaluates, with ``T = B (1 + v)``:

    R = B m / (s t(T) + o),   u_min = R dt,   depth_price = R t_d,
    dt = s_row max( (t(T) - t(B)) / (T - B),  (t(T + h) - t(T)) / h ),   h = max(h_0, B / 8)

where ``s_row`` is the measured over modelled cost of the draft rows alone
(:meth:`ElasticFloor.row_scale`, a least-squares split of the verify time into request rows and
draft rows, never below ``s``; ``s`` until steps have drafted). The exact cut's row price uses
``s_row`` too.

``dt`` is the larger of two prices of a row. The secant from plain decoding (the mean cost of the
draft rows actually verified lately) guards a concave start: on a CPU the first rows after one
cost the most, so the slope at T alone would undercharge them. The slope just past T is the
marginal cost once verify is compute-bound (a roofline hinge past its knee, where the secant
averages in the nearly free rows below the knee and so undercharges the next one). When fewer
than one row per step was verified lately the secant runs over ``max(1, B)`` rows instead.
``h_0`` (``slope_rows``, 1 by default) widens the slope's window: on a CPU a verify pass's cost
is a staircase in rows (flat for 4-6 rows, then +20% for the seventh on the AMD EPYC VM:
a one-off script, bench_row_staircase.py at 87d8d57), and a one-row slope there is either 0 or a
whole step; averaged over a step's width it is the step's cost per row.

Exploration. A profile that prices rows too dear is never corrected by prices alone: no row
pays, none is verified, and the live correction never sees one. ``explore_rows`` (set between
steps by the engine's cost feedback, engine/cost_feedback.py; 0 by default) goes into the next
:class:`StepBatch`, and ECHO then verifies that many of its best depth-1 rows whatever their
price, or only that many when the prices pay for many more (:func:`echo_scheduler.cut.best_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from echo_scheduler.cost import LatencyModel
from echo_scheduler.errors import CostModelError
from echo_scheduler.interface import RowPrice, StepBatch


@dataclass(frozen=True, slots=True)
class Floor:
    """The cost floor for one step (module docstring)."""

    min_utility: float  # u_min, expected accepted tokens a verified row must bring
    depth_price: float  # tokens one more drafter call must promise
    throughput: float  # R, the predicted tokens per second of the step
    node_price: float | None = None  # tokens one more expanded node must promise (its row)


class ElasticFloor:
    """Moving averages of step feedback and the cost floor they imply (module docstring)."""

    def __init__(
        self,
        cost: LatencyModel,
        alpha: float = 0.2,
        row_floor: float = 1.0,
        slope_rows: float = 1.0,
    ) -> None:
        """``row_floor``: the lowest row scale as a fraction of ``s`` (:meth:`row_scale`; 1.0,
        the default, never prices a draft row below the whole pass's scale). ``slope_rows``:
        ``h_0``, the least window of the floor's slope in rows (module docstring)."""
        if not 0.0 < alpha <= 1.0:
            raise CostModelError(f"alpha must be in (0, 1], got {alpha}")
        if not 0.0 < row_floor <= 1.0:
            raise CostModelError(f"row_floor must be in (0, 1], got {row_floor}")
        if not 1.0 <= slope_rows < math.inf:
            raise CostModelError(f"slope_rows must be finite and >= 1, got {slope_rows}")
        self.slope_rows = slope_rows
        self.cost = cost
        self.alpha = alpha
        self.row_floor = row_floor
        self.emitted_per_request = 1.0  # m
        self.verified_per_request = 0.0  # v
        self.other_s = 0.0  # o
        self.draft_s_per_depth = 0.0  # t_d
        self.verify_scale = 1.0  # s
        self.steps = 0
        self.explore_rows = 0  # rows the next step verifies whatever their price (the engine's)
        self._draft_moments: list[float] | None = None  # EMA of c^2, ce, e^2, cs, es
        self._verify_moments: list[float] | None = None  # EMA of p^2, pq, q^2, pv, qv

    def floor(self, batch_size: int) -> Floor:
        """u_min, the depth price and R for a step over ``batch_size`` requests."""
        if batch_size <= 0:
            return Floor(0.0, 0.0, 0.0)
        b = float(batch_size)
        rows = b * (1.0 + self.verified_per_request)
        verify = self.verify_scale * self.cost.latency_at(rows)
        rate = b * self.emitted_per_request / max(verify + self.other_s, 1e-9)
        drafts = rows - b
        if drafts < 1.0:  # little drafting lately: the first rows' secant
            drafts = max(1.0, b)
        plain = self.cost.latency_at(b)
        secant = (self.cost.latency_at(b + drafts) - plain) / drafts
        h = max(self.slope_rows, b / 8.0)
        slope = (self.cost.latency_at(rows + h) - self.cost.latency_at(rows)) / h
        marginal = max(self.row_scale() * max(secant, slope), 0.0)
        split = self.draft_split()
        if split is None:
            return Floor(rate * marginal, rate * self.draft_s_per_depth, rate)
        per_call, per_node = split
        return Floor(rate * marginal, rate * per_call, rate, rate * per_node)

    def recalibrate(self, cost: LatencyModel) -> None:
        """Price rows on ``cost`` from now on: a verify curve corrected from live steps
        (:class:`~echo_scheduler.live_cost.LiveCost`). ``s`` restarts at 1 and the row split's
        moments are dropped: both measured the old curve's error, and the new curve is the live
        median itself, so ``s`` then follows only what changed since (``row_scale`` is ``s``
        until drafted steps refill the split). The other averages (m, v, o, t_d) are kept."""
        self.cost = cost
        self.verify_scale = 1.0
        self._verify_moments = None

    def row_scale(self) -> float:
        """``s_row``: measured over modelled cost of the draft rows alone, from the weighted
        least-squares fit ``verify_s ~ s_req t(B) + s_row (t(B + N) - t(B))`` over the observed
        steps (weights decaying by ``1 - alpha / 2``), clamped to ``[f s, 4 s]`` (``f`` the
        ``row_floor``, 1 by default); ``s`` while the fit is ill-conditioned (no drafted step
        yet, or N nearly proportional to B: ``det < 0.01 pp qq`` of the normal equations).

        One-sided on purpose: online, over a run's first few dozen steps, the split is noisy
        (0.8-2.1 on the dev CPU's hold-out prompts at concurrency 8, where the whole run's fit
        says 2.2 against ``s`` 1.6), and a row priced below its cost is the dear mistake under
        load (a whole row's time for too little), while one priced above forgoes at most its
        small net value near the floor. The replay's exact profile gives ``s`` to the bit.

        The profile is measured once at a fixed context; a draft row attends to its request's
        whole context, so at long contexts its cost grows faster than the request rows' and one
        scale ``s`` for both undercharges it (dev CPU, concurrency 8, MT-Bench: ``s`` 1.6-1.7,
        ``s_row`` 1.9-2.4). At concurrency 32 the other way round: the engine's verify pass
        costs 2.1-2.4 ms per draft row (about 1.1x the profile's slope) while ``s`` is about
        1.6, so the one-sided scale prices a row about 1.45x its cost (AMD EPYC VM,
        docs/lab/2026-12-04.md); ``row_floor < 1`` lets the fit go below ``s``."""
        s, m = self.verify_scale, self._verify_moments
        if m is None:
            return s
        pp, pq, qq, pv, qv = m
        det = pp * qq - pq * pq
        if pp <= 0 or qq <= 0 or det <= 1e-2 * pp * qq:  # rows ~ requests: no stable split
            return s
        row = (qv * pp - pv * pq) / det
        if abs(row - s) <= 1e-9 * s:  # the profile is exact (the replay): keep s to the bit
            return s
        return min(max(row, self.row_floor * s), 4.0 * s)  # by default never below s

    def draft_split(self) -> tuple[float, float] | None:
        """``(c_call, c_node)``: drafter seconds per call and per expanded node, the weighted
        least-squares fit of ``draft_s ~ c_call calls + c_node expansions`` over the observed
        steps (weights decaying by ``1 - alpha``), both >= 0; None before any step reported its
        expansions, or while calls and expansions were always proportional."""
        m = self._draft_moments
        if m is None:
            return None
        cc, ce, ee, cs, es = m
        det = cc * ee - ce * ce
        if cc <= 0 or ee <= 0 or det <= 1e-4 * cc * ee:  # nearly proportional: unstable
            return None
        call, node = (cs * ee - es * ce) / det, (es * cc - cs * ce) / det
        if call < 0:
            return 0.0, max(es / ee, 0.0)
        if node < 0:
            return max(cs / cc, 0.0), 0.0
        return call, node

    def observe(
        self,
        batch_size: int,
        verified: int,
        emitted: int,
        verify_s: float,
        other_s: float,
        draft_s: float,
        depths: int,
        expansions: int | None = None,
    ) -> None:
        """One finished step: B, draft rows verified, tokens emitted, its phase times, drafter
        calls (``depths``) and, when known, nodes expanded (for :meth:`draft_split`)."""
        values = (verify_s, other_s, draft_s)
        if batch_size <= 0 or min(verified, emitted, depths) < 0:
            raise CostModelError(
                f"need batch_size > 0 and counts >= 0, got {batch_size}, {verified}, "
                f"{emitted}, {depths}"
            )
        if not all(math.isfinite(x) and x >= 0 for x in values):
            raise CostModelError(f"phase times must be finite and >= 0, got {values}")
        a = 1.0 if self.steps == 0 else self.alpha
        b = float(batch_size)
        self.emitted_per_request += a * (emitted / b - self.emitted_per_request)
        self.verified_per_request += a * (verified / b - self.verified_per_request)
        self.other_s += a * (other_s - self.other_s)
        predicted = self.cost.latency_at(b + verified)
        if predicted > 0 and verify_s > 0:
            self.verify_scale += a * (verify_s / predicted - self.verify_scale)
            p = self.cost.latency_at(b)
            q = predicted - p
            sample = [p * p, p * q, q * q, p * verify_s, q * verify_s]
            # a longer memory than s's: the split is noisier
            self._verify_moments = _ema(self._verify_moments, sample, self.alpha / 2.0)
        if depths > 0:
            per_depth = draft_s / depths
            first = self.draft_s_per_depth == 0.0
            self.draft_s_per_depth += (1.0 if first else a) * (per_depth - self.draft_s_per_depth)
            if expansions is not None and expansions >= 0:
                c, e = float(depths), float(expansions)
                sample = [c * c, c * e, e * e, c * draft_s, e * draft_s]
                self._draft_moments = _ema(self._draft_moments, sample, self.alpha)
        self.steps += 1

    def observe_phases(
        self,
        batch_size: int,
        verified: int,
        emitted: int,
        phase_s: Mapping[str, float],
        depths: int,
        expansions: int | None = None,
    ) -> None:
        """:meth:`observe` from a step's wall time per phase: ``verify``, ``draft`` and the rest
        (every other phase) as ``other_s``."""
        verify = phase_s.get("verify", 0.0)
        other = sum(phase_s.values()) - verify
        self.observe(
            batch_size,
            verified,
            emitted,
            verify,
            other,
            phase_s.get("draft", 0.0),
            depths,
            expansions,
        )


def _ema(moments: list[float] | None, sample: list[float], weight: float) -> list[float]:
    """Moving averages ``m + weight (x - m)`` of ``sample``, starting at the first sample."""
    if moments is None:
        return sample
    return [m + weight * (x - m) for m, x in zip(moments, sample, strict=True)]


def step_batch(
    floor: ElasticFloor | None, budget: int, max_nodes: Tensor, requests: Tensor | None = None
) -> StepBatch:
    """The :class:`StepBatch` of a step over ``len(max_nodes)`` requests with budget K, under the
    floor's current ``min_utility``, ``depth_price`` and row price (run rate R, the scaled verify
    profile) for the exact cut (none without a floor); ``requests``: their serials, if known."""
    b = int(max_nodes.numel())
    if floor is None:
        return StepBatch(b, budget, max_nodes, requests=requests)
    explore = floor.explore_rows
    f = floor.floor(b)
    scale = floor.row_scale()
    price = RowPrice(f.throughput, floor.cost, scale) if f.throughput > 0 else None
    return StepBatch(
        b,
        budget,
        max_nodes,
        min_utility=f.min_utility,
        depth_price=f.depth_price,
        row_price=price,
        node_price=f.node_price,
        requests=requests,
        explore_rows=explore if price is not None else 0,
    )
