"""The fixed layout's step driver: the one loop that drafts slabs for ``echo_device``.

echo_scheduler.driver drives every policy over packed pools; a policy with a fixed layout
(:class:`~echo_scheduler.device.adapter.DeviceEchoPolicy`) is driven here instead, with no host
read between depths on the policy's side::

    width = policy.begin_fixed(batch, device)      # the host's decisions for the step
    for d in 1 .. policy.fixed_depths(available):
        slab = source.slab(d, width, front)        # children of the last frontier, [B, n_d]
        if slab is None: break                     # the source drafts nothing more
        front = policy.fixed_depth(slab, last=d == depths, gate_empty=source.gate_empty)
    keep = policy.fixed_select()                   # [B, S] bool, the slabs side by side

A source drafts every frontier entry it is given (entries not to expand come back as invalid
slots), so shapes depend only on (B, W, k0, d) and the loop's length only on the host's step
decisions. One that ends early (None: nothing to expand, or it can draft nothing more) ends the
step as ``drive_step`` does when its source has nothing more: no further depth is folded, so no
gate fires there. Users: the SGLang plugin (echo_sglang.fixed_replay, over EAGLE's finished pool),
and, through :func:`drive`, every packed driver's caller (the engine, the simulator, the
replay) with :class:`~echo_scheduler.device.packed.PackedSlabs` over its packed source.

``around`` and the clock are :func:`~echo_scheduler.driver.drive_step`'s: every policy call runs
inside ``around()`` and on the step's schedule clock; the source's calls do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.device.layout import DepthSlab, Frontier
from echo_scheduler.device.packed import PackedSlabs
from echo_scheduler.driver import (
    MAX_DRAFT_DEPTH,
    Around,
    DraftSource,
    DrivenStep,
    PolicyClock,
    check_selection,
    drive_step,
)
from echo_scheduler.interface import Policy, StepBatch


class SlabSource(Protocol):
    """Where a fixed-layout step's depths come from."""

    gate_empty: bool
    """False when a depth with nothing drafted in the whole batch ends drafting before its gate
    (a finished pool replayed); True when the drafter drafts every depth it is asked for."""

    def slab(self, depth: int, width: int, front: Frontier | None) -> DepthSlab | None:
        """Depth ``depth``'s slab: the roots' first ``width`` children at depth 1, else the
        children of ``front``'s entries to expand (the rest invalid); None: nothing more."""
        ...


@dataclass(frozen=True, slots=True)
class FixedDriven:
    """What one fixed-layout step produced."""

    keep: Tensor | None  # [B, S] bool, None when the step drafted nothing
    depths: int  # slabs folded in
    schedule_s: float = 0.0  # wall time inside the policy's calls
    schedule_cpu_s: float = 0.0  # process CPU time inside them


def drive_fixed_step(
    policy: DeviceEchoPolicy,
    source: SlabSource,
    batch: StepBatch,
    available: int,
    device: torch.device,
    around: Around | None = None,
) -> FixedDriven:
    """One step of ``policy`` over ``source`` (module docstring); ``available``: the depths the
    source can draft."""
    clock = PolicyClock()
    with clock.timed(around):
        width = policy.begin_fixed(batch, device)
        depths = policy.fixed_depths(available)
    front: Frontier | None = None
    folded = 0
    for d in range(1, depths + 1):
        slab = source.slab(d, width, front)
        if slab is None:
            break
        with clock.timed(around):
            front = policy.fixed_depth(slab, last=d == depths, gate_empty=source.gate_empty)
        folded = d
    keep = None
    if folded:
        with clock.timed(around):
            keep = policy.fixed_select()
    return FixedDriven(keep, folded, clock.wall, clock.cpu)


def drive(
    policy: Policy,
    source: DraftSource,
    batch: StepBatch,
    *,
    max_depth: int = MAX_DRAFT_DEPTH,
    strict: bool = False,
    around: Around | None = None,
) -> DrivenStep:
    """One step of ``policy`` over a packed ``source``: in the fixed layout
    (:func:`drive_fixed_step` over :class:`~echo_scheduler.device.packed.PackedSlabs`) for a
    policy that has one, else :func:`~echo_scheduler.driver.drive_step`. Either way the same
    :class:`~echo_scheduler.driver.DrivenStep`, its selection checked by the same
    ``check_selection`` (the plans are the source's own, built from the frontier, so there is
    no ``check_plan``); in the fixed layout its schedule time holds the policy's calls and the
    conversion between the layouts (:attr:`PackedSlabs.clock`), so that it compares with the
    packed loop's.

    A ``max_depth`` below the policy's own ``config.max_depth`` goes to the packed loop: there
    ``echo``'s last plan still counts the nodes it would expand in the ledger, which the fixed
    loop, folding that depth as the last, would not. ``strict`` applies to the packed loop only:
    the fixed loop's length is the policy's ``fixed_depths``."""
    if not isinstance(policy, DeviceEchoPolicy) or max_depth < policy.config.max_depth:
        return drive_step(policy, source, batch, max_depth=max_depth, strict=strict, around=around)
    caps = batch.max_nodes
    slabs = PackedSlabs(source, caps, policy.config.draft_width)
    run = drive_fixed_step(policy, slabs, batch, max_depth, caps.device, around)
    keep = slabs.keep(run.keep)
    tree = check_selection(slabs.pool, keep, batch.budget, caps)
    wall, cpu = run.schedule_s + slabs.clock.wall, run.schedule_cpu_s + slabs.clock.cpu
    return DrivenStep(slabs.pool, keep, tree, slabs.depths, slabs.expansions, wall, cpu)
