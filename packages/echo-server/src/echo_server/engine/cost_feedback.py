"""The engine's verify-cost model corrected from its own steps: a :class:`StepReport` consumer.

Every decode pass on the CPU reports the target's forward + logits seconds
(``VerifiedStep.forward_s``, the quantity the start-up profile times) over ``T = B + N`` rows
(B roots, N draft rows). :class:`CostFeedback` feeds each ``(T, seconds)`` to an
:class:`~echo_scheduler.live_cost.LiveCost` over the engine's profile, and whenever its
``refresh`` gives a corrected curve (a ready row count off the curve in use by more than 10%):

- the elastic floor prices rows on it (``ElasticFloor.recalibrate``);
- with ``--budget auto`` the budget's hinge is refitted to it, so K = K_max(B) follows the
  corrected knee, capped at the K(1) the engine's KV admission reserved slack for
  (``verify_slack = K(1) + max_batch``: a larger K could run a verify pass out of KV; raising
  it would need re-reserving the slack of requests already admitted, not done).

Exploration. If the profile prices draft rows too dear, no row pays, none is verified, and only
``T = B`` is ever timed: the correction then scales the wrong shape and never fixes it (the
planted "dear" profile kept ECHO at 0.80-0.86x of a clean start at c = 1,
packages/echo-lab/scripts/profile_recovery.py). So after every decode step the floor's
``explore_rows`` names the first of the row counts ``B + 1 .. B + EXPLORE_SPAN`` (B the last
step's batch) with no ready bucket (0 when all are timed), and ECHO, once its pre-check has
refused every row for a few steps in a row, or it has drafted that many steps in a row, verifies
exactly that many of its best depth-1 rows whatever their price (echo_scheduler.policies.echo,
``EXPLORE_AFTER``). The second case is a profile pricing rows as free: ECHO then verified 16
rows a step at c = 8, the only row count it timed, so the corrected curve stayed that profile's
flat shape scaled to it. A step that did not draft because
drafting measured as a loss never explores: forcing rows whenever they were untimed cost 1-2.4%
at c = 8 on MT-Bench on the Intel Xeon VM (bench_echo_variants.py arm ``echo-noexplore``,
docs/BENCHMARKS.md).

Each report leaves with a :class:`CostSnapshot` (``StepReport.cost``): the profile's source
(``cached``, ``fresh``, ``unsettled``; ``none`` when the engine measured no profile: a fixed
budget without the floor), per row count the live median next to the profile and the curve in
use, and the swap count; ``/metrics`` shows it (grpc/metrics.py). The snapshot is rebuilt every
``SNAPSHOT_EVERY`` samples and on every swap, and shared by the reports in between.

On CUDA the forward is asynchronous and ``forward_s`` is None: each pass instead carries two
events recorded around the same calls (``VerifiedStep.forward_events``), queued in a
:class:`~echo_server.engine.pass_timing.PendingTimings` and read once the device has passed them
(``query``, no wait; the engine's own per-step sync normally completes them within the step).
Their device time is the sample: the same correction, without a sync of its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from echo_scheduler.budget import BudgetChain
from echo_scheduler.cost import ProfileCost, VerifyCostModel
from echo_scheduler.elastic import ElasticFloor
from echo_scheduler.errors import CostModelError
from echo_scheduler.live_cost import BucketEstimate, LiveCost
from echo_server.engine.pass_timing import PendingTimings
from echo_server.engine.profile_store import CheckedProfile, peek

if TYPE_CHECKING:
    from echo_server.engine.engine import Engine
    from echo_server.engine.report import StepReport, VerifiedStep

EXPLORE_SPAN = 3
"""Row counts above a step's B that exploration makes sure are timed: B + 1 to B + 3, the rows
ECHO's depth-1 drafts add (once their price is known, deeper rows are priced, verified and
timed as usual). One exploration in five steps while the prices refuse every row: the three
are timed (8 samples each) within about 120 steps, inside the 200 issue #47 allows."""

SNAPSHOT_EVERY = 16
"""Samples between two snapshots: the metrics need not change per step (a scrape is seconds
apart), and a snapshot walks every tracked row count."""


@dataclass(frozen=True, slots=True)
class CostSnapshot:
    """The verify-cost model as it stands (module docstring)."""

    source: str  # cached | fresh | unsettled | none
    buckets: tuple[BucketEstimate, ...]
    samples: int  # (T, seconds) samples observed
    swaps: int  # corrected curves put in use
    k_ceiling: int | None  # the cap on a corrected K (None: fixed budget)


class CostFeedback:
    """Feeds live verify times to :class:`LiveCost` and corrected curves to the floor and K."""

    def __init__(
        self,
        checked: CheckedProfile | None,
        floor: ElasticFloor | None,
        budget: BudgetChain,
        k_ceiling: int | None,
    ) -> None:
        self.checked, self.floor, self.budget = checked, floor, budget
        self.k_ceiling = k_ceiling
        self.live = LiveCost(checked.profile if checked is not None else None)
        self.pending = PendingTimings()  # CUDA passes' events not yet read
        self.explores = True  # False: never ask (the bench's echo-noexplore arm)
        self.snapshot = self._snapshot()

    @classmethod
    def attach(cls, engine: Engine) -> CostFeedback:
        """For ``engine`` after its budget and floor are built: the profile they were built on
        (engine/profile_store.py's, if one was obtained) and the K its admission allows."""
        auto = engine.budget.local.cost is not None
        priced = auto or engine.elastic is not None
        checked = peek(engine.model, engine.config.profile_cache) if priced else None
        ceiling = engine.budget.local.budget(1) if auto else None
        return cls(checked, engine.elastic, engine.budget, ceiling)

    def observe(self, report: StepReport) -> StepReport:
        """Take ``report``'s samples (:func:`samples_of`), and return the report with the
        snapshot after them."""
        for v in report.passes:
            if v.forward_events is not None:
                self.pending.add(rows_of(v), v.forward_events)
        self.take(samples_of(report) + self.pending.ready())
        if self.floor is not None:
            self.floor.explore_rows = self.explore_rows([len(v.request_ids) for v in report.passes])
        return dataclasses.replace(report, cost=self.snapshot)

    def explore_rows(self, batches: list[int]) -> int:
        """The untimed draft-row count to explore next (module docstring), after a step whose
        decode passes had ``batches`` requests each; 0 when there is none."""
        if not batches or not self.explores:
            return 0
        b = batches[-1]
        return next((r for r in range(1, EXPLORE_SPAN + 1) if not self.live.is_ready(b + r)), 0)

    def take(self, samples: list[tuple[int, float]]) -> ProfileCost | None:
        """Feed ``(rows, seconds)`` samples; apply and return a corrected curve if one is due."""
        for rows, seconds in samples:
            self.live.observe(rows, seconds)
        if not samples:
            return None
        curve = self.live.refresh()
        if curve is not None:
            self.apply(curve)
        if curve is not None or self.live.observed % SNAPSHOT_EVERY < len(samples):
            self.snapshot = self._snapshot()
        return curve

    def apply(self, curve: ProfileCost) -> None:
        """Price the floor's rows and refit the auto budget's hinge on ``curve``."""
        if self.floor is not None:
            self.floor.recalibrate(curve)
        local = self.budget.local
        if local.cost is not None and self.k_ceiling is not None:
            try:
                hinge = VerifyCostModel.fit(list(curve.tokens), list(curve.seconds))
            except CostModelError:  # fewer than 3 points: keep the hinge
                return
            cap = (
                self.k_ceiling
                if local.max_budget is None
                else min(local.max_budget, self.k_ceiling)
            )
            self.budget.local = dataclasses.replace(local, cost=hinge, max_budget=cap)

    def _snapshot(self) -> CostSnapshot:
        source = self.checked.source.value if self.checked is not None else "none"
        return CostSnapshot(
            source,
            tuple(self.live.buckets()),
            self.live.observed,
            self.live.swaps,
            self.k_ceiling,
        )


def rows_of(verified: VerifiedStep) -> int:
    """``T``, the rows of a decode pass: its roots plus its draft rows."""
    return len(verified.request_ids) + verified.tree.num_nodes


def samples_of(report: StepReport) -> list[tuple[int, float]]:
    """``(T, forward seconds)`` of each wall-timed decode pass of ``report`` (the CPU's); none
    for a pass without ``forward_s`` (CUDA's come from their events: module docstring)."""
    return [(rows_of(v), v.forward_s) for v in report.passes if v.forward_s is not None]
