"""Acceptance fed back from SGLang into the policy and the gate drift monitor.

SGLang calls ``on_verify_complete_cpu(num_correct_drafts_per_req, batch_size)`` on its spec worker
after every decode verify, once the accept lengths are on the host
(``batch_result_processor._resolve_spec_v2_tokens``: SGLang's accept length minus its one bonus
token, so ``a_b`` counts accepted draft tokens only). ECHO serves without overlap scheduling
(:mod:`~echo_sglang.spec_algo`), so the call always follows the plan of the same batch, in the
same request order; a call whose length is not that batch's size is refused.

From the step's verified tree ``S`` (the selection) and drafted pool ``V`` (the policy's last view):

- ``StepOutcome(accepted_lengths = a, verified = n_b = |S_b|)`` for ``policy.observe``;
- one gate observation per (request b, depth d) with a verified depth-d node:
  ``(d, C_b(d), a_b >= d)``, with the layer confidence ``C_b(d) = max_{i in V_b, depth_i = d} P_i``
  the gates saw (:func:`echo_gating.signals.depth_confidences` on ``V``). Greedy verification
  accepts one root path, so "some depth-d node of b was accepted" is exactly ``a_b >= d``:
  :func:`echo_gating.drift.gate_observations` over ``S`` with every node of depth ``<= a_b``
  marked gives the same labels as with the true path, without knowing which branch it took.

Worked example: request 0 verified nodes at depths 1, 1, 2 and accepted 1 token; request 1
verified one depth-1 node and accepted none. Observations: ``(1, C_0(1), True)``,
``(2, C_0(2), False)``, ``(1, C_1(1), False)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch, select_nodes
from echo_gating.drift import gate_observations
from echo_gating.records import GateSamples
from echo_gating.signals import depth_confidences
from echo_scheduler.interface import StepOutcome
from echo_sglang.args import PluginConfigError


class FeedbackError(PluginConfigError):
    """SGLang's accept counts do not belong to the step ECHO planned (wrong batch or order)."""


@dataclass(frozen=True, slots=True)
class StepFeedback:
    """One verified step as the policy and the drift monitor see it."""

    outcome: StepOutcome
    observations: GateSamples


def step_feedback(
    verified: TreeBatch,  # S: the tree SGLang verified
    pool: TreeBatch,  # every node EAGLE drafted
    drafted: Tensor,  # [N_pool] bool, the policy's drafted view V of the pool
    num_correct: Sequence[int],  # SGLang's accepted draft tokens per request, bonus excluded
) -> StepFeedback:
    """Outcome and gate observations of one step (module docstring); raise FeedbackError."""
    b = verified.batch_size
    if len(num_correct) != b:
        raise FeedbackError(
            f"SGLang reported accept counts for {len(num_correct)} requests, but ECHO planned "
            f"this step for {b}: overlap scheduling must stay off"
        )
    dev = verified.device
    accepted = torch.tensor(list(num_correct), dtype=torch.int64, device=dev)  # moved once
    req = verified.request_index()
    deepest = torch.zeros(b, dtype=torch.int64, device=dev).scatter_reduce(
        0, req, verified.depth, reduce="amax", include_self=True
    )
    bad = (accepted < 0) | (accepted > deepest)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise FeedbackError(
            f"request {i} accepted {int(accepted[i])} draft tokens, but ECHO verified it to "
            f"depth {int(deepest[i])}: the counts belong to another step"
        )
    # one accepted root path per request: some depth-d node of b accepted iff a_b >= d
    reached = verified.depth <= accepted[req]
    seen = depth_confidences(select_nodes(pool, drafted), max_depth=verified.max_depth())
    return StepFeedback(
        outcome=StepOutcome(accepted_lengths=accepted, verified=verified.nodes_per_request()),
        observations=gate_observations(verified, reached, table=seen),
    )
