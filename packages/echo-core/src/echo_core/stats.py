"""Per-step acceptance metrics and their running totals.

For one verify step over ``B`` requests, request ``b`` verified ``n_b`` draft nodes, accepted
``a_b`` of them (its accepted path length) and emitted one bonus token. Then

- ``draft_yield = sum_b a_b / sum_b n_b`` (0.0 when nothing was verified): the fraction of
  verified draft tokens that were accepted, i.e. the return on the verify budget;
- ``mean_accepted_length = sum_b (a_b + 1) / B`` (0.0 for an empty batch): tokens emitted per
  request per step, the usual "acceptance length" of speculative decoding;
- ``accepted_per_depth[d-1] = #{b : a_b >= d}`` (an accepted path holds one node per depth) and
  ``verified_per_depth[d-1] = #{verified nodes at depth d}``, for ``d = 1..Dmax``.

Worked example: request 0 verifies a chain of 3 and accepts 2; request 1 verifies 2 root
children and accepts none; request 2 verifies nothing. ``n = [3, 2, 0]``, ``a = [2, 0, 0]``,
``draft_yield = 2 / 5 = 0.4``, ``mean_accepted_length = (2 + 0 + 0 + 3) / 3 = 5/3``,
``accepted_per_depth = [1, 1, 0]``, ``verified_per_depth = [3, 1, 1]``.

:class:`StatsAccumulator` sums steps and reports the same ratios over all of them (totals first,
then the ratio, so long and short steps weigh by their tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult
from echo_core.errors import AcceptanceError
from echo_core.tree import TreeBatch


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


@dataclass(frozen=True, slots=True)
class AcceptanceTotals:
    """Acceptance counts over any set of request-steps; the one home of the two ratios.

    A request-step is one request in one verify pass: it verifies ``n`` draft nodes, accepts
    ``a`` and emits ``a + 1`` tokens (the bonus). Over a set of them,

    - ``draft_yield = accepted / verified`` (0.0 when nothing was verified);
    - ``mean_accepted_length = (accepted + request_steps) / request_steps`` (0.0 for none).

    Totals add and subtract (windows, deltas between reports) before the ratio is taken, so
    long and short steps weigh by their tokens. ``request_steps`` counts requests, not engine
    steps: a step over 8 requests adds 8.
    """

    request_steps: int = 0
    verified: int = 0
    accepted: int = 0

    def __post_init__(self) -> None:
        if min(self.request_steps, self.verified, self.accepted) < 0:
            raise AcceptanceError(f"acceptance totals must be >= 0, got {self}")

    def __add__(self, other: AcceptanceTotals) -> AcceptanceTotals:
        return AcceptanceTotals(
            self.request_steps + other.request_steps,
            self.verified + other.verified,
            self.accepted + other.accepted,
        )

    def __sub__(self, earlier: AcceptanceTotals) -> AcceptanceTotals:
        """The counts added since ``earlier`` (a snapshot of the same running totals)."""
        return AcceptanceTotals(
            self.request_steps - earlier.request_steps,
            self.verified - earlier.verified,
            self.accepted - earlier.accepted,
        )

    @property
    def emitted(self) -> int:
        """Tokens emitted by these request-steps: accepted plus one bonus each."""
        return self.accepted + self.request_steps

    @property
    def draft_yield(self) -> float:
        """``accepted / verified``, 0.0 when nothing was verified."""
        return _ratio(self.accepted, self.verified)

    @property
    def mean_accepted_length(self) -> float:
        """``(accepted + request_steps) / request_steps``, 0.0 for no request-steps."""
        return _ratio(self.emitted, self.request_steps)


@dataclass(frozen=True, slots=True)
class StepStats:
    """Acceptance metrics of one verify step (see the module docstring for the formulas)."""

    verified: Tensor  # [B] int64, n_b: draft nodes verified
    accepted: Tensor  # [B] int64, a_b: draft nodes accepted
    bonus: Tensor  # [B] int64, bonus tokens emitted (1 each)
    accepted_per_depth: Tensor  # [Dmax] int64, index d-1 counts accepted nodes at depth d
    verified_per_depth: Tensor  # [Dmax] int64, index d-1 counts verified nodes at depth d

    @classmethod
    def from_result(cls, tree: TreeBatch, result: AcceptResult) -> StepStats:
        """The metrics of ``result``, an acceptance of ``tree``."""
        if result.batch_size != tree.batch_size:
            raise AcceptanceError(
                f"result has {result.batch_size} requests, tree has {tree.batch_size}"
            )
        depth_ids = torch.arange(1, tree.max_depth() + 1, device=tree.device)  # [Dmax]
        accepted = result.num_accepted.to(tree.device)
        return cls(
            verified=tree.nodes_per_request(),
            accepted=accepted,
            bonus=torch.ones_like(accepted),
            accepted_per_depth=(accepted[None, :] >= depth_ids[:, None]).sum(dim=1),
            verified_per_depth=torch.bincount(tree.depth - 1, minlength=depth_ids.numel()),
        )

    @property
    def batch_size(self) -> int:
        return int(self.verified.numel())

    @property
    def total_verified(self) -> int:
        return int(self.verified.sum())

    @property
    def total_accepted(self) -> int:
        return int(self.accepted.sum())

    @property
    def totals(self) -> AcceptanceTotals:
        """This step's counts (``B`` request-steps)."""
        return AcceptanceTotals(self.batch_size, self.total_verified, self.total_accepted)

    @property
    def total_emitted(self) -> int:
        """Accepted plus bonus tokens."""
        return self.totals.emitted

    @property
    def draft_yield(self) -> float:
        """:attr:`AcceptanceTotals.draft_yield` of this step."""
        return self.totals.draft_yield

    @property
    def mean_accepted_length(self) -> float:
        """:attr:`AcceptanceTotals.mean_accepted_length` of this step."""
        return self.totals.mean_accepted_length


@dataclass(slots=True)
class StatsAccumulator:
    """Running totals over many steps; the ratios are taken over the totals."""

    steps: int = 0
    request_steps: int = 0  # sum of B over steps
    verified: int = 0
    accepted: int = 0
    bonus: int = 0
    _accepted_per_depth: list[int] = field(default_factory=list, init=False)
    _verified_per_depth: list[int] = field(default_factory=list, init=False)

    def add(self, step: StepStats) -> None:
        self.steps += 1
        self.request_steps += step.batch_size
        self.verified += step.total_verified
        self.accepted += step.total_accepted
        self.bonus += int(step.bonus.sum())
        for totals, counts in (
            (self._accepted_per_depth, step.accepted_per_depth.tolist()),
            (self._verified_per_depth, step.verified_per_depth.tolist()),
        ):
            totals.extend([0] * (len(counts) - len(totals)))
            for d, c in enumerate(counts):
                totals[d] += c

    def reset(self) -> None:
        """Forget every step added so far."""
        self.steps = self.request_steps = self.verified = self.accepted = self.bonus = 0
        self._accepted_per_depth.clear()
        self._verified_per_depth.clear()

    @property
    def totals(self) -> AcceptanceTotals:
        """The counts over every step added."""
        return AcceptanceTotals(self.request_steps, self.verified, self.accepted)

    @property
    def draft_yield(self) -> float:
        """:attr:`AcceptanceTotals.draft_yield` over every step added."""
        return self.totals.draft_yield

    @property
    def mean_accepted_length(self) -> float:
        """:attr:`AcceptanceTotals.mean_accepted_length` over every step added."""
        return self.totals.mean_accepted_length

    @property
    def accepted_per_depth(self) -> Tensor:
        """[Dmax] int64 over all steps; Dmax is the deepest depth seen."""
        return torch.tensor(self._accepted_per_depth, dtype=torch.int64)

    @property
    def verified_per_depth(self) -> Tensor:
        """[Dmax] int64 over all steps; Dmax is the deepest depth seen."""
        return torch.tensor(self._verified_per_depth, dtype=torch.int64)
