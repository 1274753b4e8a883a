"""A fixed baseline offered ECHO's cost floor: the same rows-must-pay rule, its own tree shape.

:class:`FlooredChain`, :class:`FlooredStatic` and :class:`FlooredEagle2` are the fixed policies
(chain, static, EAGLE-2) with the two parts of ECHO's elastic floor that do not depend on how
ECHO ranks (echo_scheduler.policies.echo):

- the pre-check (:func:`~echo_scheduler.policies.echo.first_depth_pays`): when not even the best
  depth-1 draft, ``m_1(0)`` under the calibrated acceptance maps, can pay for its row and the
  drafter call at the step's prices, the step is not drafted (plain decoding);
- the exact cut (:func:`~echo_scheduler.cut.exact_cut`): of the rows the fixed policy selected,
  only the ``k*`` best by calibrated key ``u'_i = min(m_{d_i}(log P_i), u'_parent)`` are
  verified, ``k* = argmax_k G(k) - R t(B + k)`` at the step's row price.

The tree it drafts and selects is the fixed policy's; without prices (no ``row_price``, no floor)
it is that policy exactly. Issue #16 asked for every fixed baseline to be offered the same floor
as ECHO: the replay's optional ``<arm>+floor`` arms (echo_lab.replay.arms).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.maps import AcceptanceMaps
from echo_gating.policy import GatePolicy
from echo_scheduler.config import PolicyConfig
from echo_scheduler.cut import exact_cut
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import DraftPlan, StepBatch
from echo_scheduler.policies.echo import (
    best_first_value,
    calibrated_key,
    depth_price,
    first_depth_pays,
    priced,
)
from echo_scheduler.policies.uniform import (
    ChainPolicy,
    Eagle2Policy,
    StaticTreePolicy,
    _UniformPolicy,
)


class _Floored(_UniformPolicy):
    """The floor over a fixed policy's own drafting and selection (module docstring); ``gate``
    supplies the calibrated acceptance maps (its thresholds are not used)."""

    def __init__(self, config: PolicyConfig, gate: GatePolicy | None) -> None:
        super().__init__(config)
        if gate is None or gate.acceptance_maps is None:
            raise PolicyError(f"{self.name}+floor needs a GatePolicy with acceptance maps")
        self.gate = gate
        self.name = f"{self.name}+floor"
        self._best: tuple[AcceptanceMaps, float] | None = None
        self._plain = False  # this step skipped drafting (the pre-check)

    @property
    def maps(self) -> AcceptanceMaps:
        maps = self.gate.acceptance_maps
        assert maps is not None  # checked in __init__ and set_gate
        return maps

    def _start(self, batch: StepBatch) -> None:
        super()._start(batch)
        self._plain = False

    def _first_plan(self, batch: StepBatch) -> DraftPlan:
        if priced(batch):
            live = int((batch.max_nodes > 0).sum())
            pays = first_depth_pays(
                self._best_first(batch), batch, live, depth_price(batch, self.config)
            )
            if not pays:
                self._plain = True
                return DraftPlan.finished(batch.max_nodes.device)
        return super()._first_plan(batch)

    def select(self, pool: TreeBatch) -> Tensor:
        if self._plain:
            return torch.zeros(pool.num_nodes, dtype=torch.bool, device=pool.device)
        keep = super().select(pool)
        price = self.batch.row_price
        if price is None:
            return keep
        return exact_cut(calibrated_key(pool, self.maps), keep, pool.batch_size, price)

    def active_gate(self) -> GatePolicy:
        return self.gate

    def set_gate(self, gate: GatePolicy) -> bool:
        if gate.acceptance_maps is None:
            return False
        self.gate = gate
        return True

    def _best_first(self, batch: StepBatch) -> float:
        cached = self._best
        if cached is None or cached[0] is not self.maps:
            self._best = cached = (self.maps, best_first_value(self.maps, batch.max_nodes.device))
        return cached[1]


class FlooredChain(_Floored, ChainPolicy):
    """A chain of ``chain_length`` with the floor."""


class FlooredStatic(_Floored, StaticTreePolicy):
    """A static tree of ``static_branching`` with the floor."""


class FlooredEagle2(_Floored, Eagle2Policy):
    """An EAGLE-2 tree of ``num_draft_tokens - 1`` nodes with the floor."""
