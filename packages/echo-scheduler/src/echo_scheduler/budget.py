"""The per-step budget chain, composed in one place: K -> lease -> cap -> floor -> cut.

Every step's verification budget is the end of one chain, the same for echo-server's engine and
echo-sglang's plugin:

1. local K  (:class:`LocalBudget`): a fixed K, or the knee of a verify-cost profile,
            ``K_max(B) = max(0, floor(T0) - B)`` (:func:`echo_scheduler.cost.k_max_at`, the
            knee ``T0`` of a fitted :class:`~echo_scheduler.cost.VerifyCostModel` or given as a
            number), clamped to ``[min_budget, max_budget]``;
2. lease    a budget controller's grant caps K (never lifts it: the KV slack of admitted requests
            was sized for the local K, and past the knee extra tokens cost more than they earn);
3. cap      the step's own ceiling where it has one (SGLang's padded verify width: ``B (N - 1)``);
4. floor    the elastic cost floor (:class:`~echo_scheduler.elastic.ElasticFloor`): a row's
            least utility, the depth price and the row price of the step
            (:func:`~echo_scheduler.elastic.step_batch`);
5. cut      the policy keeps the ``k*`` best of its selected rows at that row price
            (:func:`~echo_scheduler.cut.exact_cut`, run by the policies that honour
            ``StepBatch.row_price``; :func:`cut` here for anyone else).

The formulas stay in their modules (cost.py, elastic.py, cut.py); :class:`BudgetChain` is the one
place that composes them, and gives the :class:`~echo_scheduler.interface.StepBatch` a policy
drives. Worked example (SGLang, ``--speculative-echo-knee-tokens 96``, ``N = 9``): at ``B = 32``
the knee gives ``96 - 32 = 64``, the cap ``32 * 8 = 256``, so ``K = 64``; at ``B = 100`` the knee
gives 0: only the roots are verified.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from echo_scheduler.cost import VerifyCostModel, k_max_at
from echo_scheduler.cut import exact_cut
from echo_scheduler.elastic import ElasticFloor, step_batch
from echo_scheduler.errors import CostModelError
from echo_scheduler.interface import StepBatch


@dataclass(frozen=True, slots=True)
class LocalBudget:
    """Link 1, K before any lease: ``fixed`` when set, else the knee's ``K_max(B)`` (of ``cost``,
    or of ``knee_tokens`` given directly) clamped to ``[min_budget, max_budget]`` (None: no upper
    bound). With none of the three there is no local limit: K is the step's cap."""

    fixed: int | None = None
    cost: VerifyCostModel | None = None
    knee_tokens: float | None = None
    min_budget: int = 0
    max_budget: int | None = 256

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.fixed, self.cost, self.knee_tokens))
        if given > 1:
            raise ValueError("give at most one of a fixed budget, a cost model and a knee")
        if self.fixed is not None and self.fixed < 0:
            raise ValueError(f"budget must be >= 0, got {self.fixed}")

    def budget(self, batch_size: int) -> int | None:
        """K for ``batch_size`` requests; None when nothing local limits it."""
        if self.fixed is not None:
            return self.fixed
        if self.cost is not None:
            knee = self.cost.k_max(batch_size)
        elif self.knee_tokens is not None:
            knee = k_max_at(self.knee_tokens, batch_size)
        else:
            return None
        knee = max(knee, self.min_budget)
        return knee if self.max_budget is None else min(knee, self.max_budget)


class BudgetChain:
    """K and the step's prices through the whole chain (module docstring).

    ``k(B, cap) = min(local.budget(B), lease, cap)`` over the links that are set; ``step``
    adds the floor's prices. The lease is the only state that changes from outside between
    steps (:meth:`set_lease`); the floor learns from every step (:meth:`observe`).
    """

    def __init__(self, local: LocalBudget, floor: ElasticFloor | None = None) -> None:
        self.local = local
        self.floor = floor
        self.lease: int | None = None

    def set_lease(self, k: int | None) -> None:
        """Cap K at ``k`` from the next step on; None restores the local budget."""
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise ValueError(f"budget override must be an int >= 0 or None, got {k!r}")
        self.lease = k

    def local_k(self, batch_size: int) -> int:
        """Link 1 alone (a node's own ceiling, e.g. ``k_max`` of its registration)."""
        k = self.local.budget(batch_size)
        if k is None:
            raise CostModelError("this budget has no local limit: K needs the step's cap")
        return k

    def k(self, batch_size: int, cap: int | None = None) -> int:
        """Links 1-3: K for a step over ``batch_size`` requests, under ``cap`` if given."""
        k = self.local.budget(batch_size)
        for limit in (self.lease, cap):
            if limit is not None:
                k = limit if k is None else min(k, limit)
        if k is None:
            raise CostModelError("this budget has no local limit: K needs the step's cap")
        return k

    def step(
        self, max_nodes: Tensor, requests: Tensor | None = None, cap: int | None = None
    ) -> StepBatch:
        """Links 1-4: the :class:`StepBatch` of a step over ``len(max_nodes)`` requests (per
        request caps ``max_nodes``; ``requests`` their serials, if known)."""
        k = self.k(int(max_nodes.numel()), cap)
        return step_batch(self.floor, k, max_nodes, requests)

    def observe(
        self,
        batch_size: int,
        verified: int,
        emitted: int,
        phase_s: Mapping[str, float],
        depths: int,
        expansions: int | None = None,
    ) -> None:
        """A finished step's feedback to the floor (no-op without one)."""
        if self.floor is not None:
            self.floor.observe_phases(batch_size, verified, emitted, phase_s, depths, expansions)


def cut(key: Tensor, keep: Tensor, step: StepBatch) -> Tensor:
    """Link 5: ``keep`` cut to its ``k*`` best rows at the step's row price (unchanged without
    one); what the policies do with ``StepBatch.row_price``."""
    if step.row_price is None:
        return keep
    return exact_cut(key, keep, step.batch_size, step.row_price)
