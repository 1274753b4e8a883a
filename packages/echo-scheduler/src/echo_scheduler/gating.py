"""Where a policy's confidence gate is applied: truncation at the gate's checkpoints.

ECHO drafts depth by depth; after depth ``d`` the gate (a calibrated
:class:`~echo_gating.policy.GatePolicy`) may be a checkpoint. There, each request's layer
confidence ``C_b(d)`` (echo-gating's :func:`~echo_gating.signals.layer_confidence`) is compared
with the threshold ``tau_d``; a request with ``C_b(d) < tau_d`` is truncated at ``t_b = d``: it
drafts no deeper this step and none of its nodes deeper than ``d`` may be selected. So

    t_b <- d   if gate.is_checkpoint(d) and C_b(d) < tau_d and t_b > d,   else t_b unchanged.

The compared value is the gate's ``signal`` (:data:`echo_gating.signals.GATE_SIGNALS`), the layer
confidence unless the policy names another (``sibling_margin``).

Between checkpoints nothing is decided (the gates are sparse); truncated requests later receive
width instead of depth (echo_scheduler.policies.echo, Priority 2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.policy import GatePolicy
from echo_gating.signals import gate_signal


def apply_gate(gate: GatePolicy, pool: TreeBatch, depth: int, truncated_at: Tensor) -> Tensor:
    """[B] int64 truncation depths after the gate at ``depth`` (module docstring)."""
    if not gate.is_checkpoint(depth):
        return truncated_at
    passed = gate.gate(depth, gate_signal(pool, depth, gate.signal))
    return torch.where(~passed & (truncated_at > depth), depth, truncated_at)
