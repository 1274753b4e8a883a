"""The fixed layout's step driver: the one loop that drafts slabs for ``echo_device``.

echo_scheduler.driver drives every policy over packed pools; a drafter that drafts the fixed
layout (echo_scheduler.device.layout) is driven here instead, with no host read between
depths::

    width = policy.begin_fixed(batch, device)      # the host's decisions for the step
    for d in 1 .. policy.fixed_depths(available):
        slab = source.slab(d, width, front)        # children of the last frontier, [B, n_d]
        front = policy.fixed_depth(slab, last=d == depths, gate_empty=source.gate_empty)
    keep = policy.fixed_select()                   # [B, S] bool, the slabs side by side

The source drafts every frontier entry it is given whole (entries not to expand come back as
invalid slots), so shapes depend only on (B, W, k0, d) and the loop's length only on the host's
step decisions. Users: the SGLang plugin (echo_sglang.fixed_replay, over EAGLE's finished pool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.device.layout import DepthSlab, Frontier
from echo_scheduler.interface import StepBatch


class SlabSource(Protocol):
    """Where a fixed-layout step's depths come from."""

    gate_empty: bool
    """False when a depth with nothing drafted in the whole batch ends drafting before its gate
    (a finished pool replayed); True when the drafter drafts every depth it is asked for."""

    def slab(self, depth: int, width: int, front: Frontier | None) -> DepthSlab:
        """Depth ``depth``'s slab: the roots' first ``width`` children at depth 1, else the
        children of ``front``'s entries to expand (the rest invalid)."""
        ...


@dataclass(frozen=True, slots=True)
class FixedDriven:
    """What one fixed-layout step produced."""

    keep: Tensor | None  # [B, S] bool, None when the step drafted nothing
    depths: int  # slabs folded in


def drive_fixed_step(
    policy: DeviceEchoPolicy,
    source: SlabSource,
    batch: StepBatch,
    available: int,
    device: torch.device,
) -> FixedDriven:
    """One step of ``policy`` over ``source`` (module docstring); ``available``: the depths the
    source can draft."""
    width = policy.begin_fixed(batch, device)
    depths = policy.fixed_depths(available)
    front: Frontier | None = None
    for d in range(1, depths + 1):
        slab = source.slab(d, width, front)
        front = policy.fixed_depth(slab, last=d == depths, gate_empty=source.gate_empty)
    return FixedDriven(policy.fixed_select() if depths else None, depths)
