"""A node's marginal-utility curve: expected accepted tokens for each extra budget token.

From the node's recent warm-up records (one per verified draft node, with ``accepted``):

1. per request-step, rank its verified nodes by path score (what the budget policies rank by);
   ``a[j]`` = acceptance rate of rank-j nodes over the request-steps that verified a rank j;
2. make ``a`` non-increasing (running minimum: diminishing returns, conservatively);
3. a batch of ``B`` running requests spends budget on all of them in turn, so the node's
   curve interleaves ``B`` copies: token ``t`` has utility ``a[t // B]``;
4. extend flat to ``k_max`` (ranks the node never verified, e.g. under a small lease, are
   assumed as good as its last measured rank), then average over buckets of ``budget_step``.

An idle node (nothing running or waiting) gains nothing from budget: empty curve. A busy node
without records yet reports the flat ``PRIOR_ACCEPTANCE`` so that it earns a budget to measure.

Worked example: rank rates ``[0.8, 0.4]``, B = 2, k_max 6, step 2 -> per token
``[0.8, 0.8, 0.4, 0.4, 0.4, 0.4]`` -> buckets ``[0.8, 0.4, 0.4]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_gating.records import RecordSet

PRIOR_ACCEPTANCE = 0.5
"""Utility per token assumed before any draft token was verified on this node."""


def rank_acceptance(records: RecordSet) -> Tensor:
    """[R] float64: acceptance rate of the rank-j node (by path score) of a request-step."""
    if len(records) == 0:
        return torch.zeros(0, dtype=torch.float64)
    _, group = torch.unique(
        torch.stack([records.request_id, records.step], dim=1), dim=0, return_inverse=True
    )
    by_score = torch.sort(records.path_logprob, descending=True, stable=True).indices
    order = by_score[torch.sort(group[by_score], stable=True).indices]  # group asc, score desc
    sorted_group = group[order]
    starts = torch.searchsorted(sorted_group, sorted_group, right=False)
    rank = torch.arange(order.numel()) - starts
    hits = torch.zeros(int(rank.max()) + 1, dtype=torch.float64)
    hits.index_add_(0, rank, records.accepted[order].to(torch.float64))
    counts = torch.bincount(rank).to(torch.float64)
    return hits / counts


def marginal_utility(
    rates: Tensor | None, running: int, waiting: int, k_max: int, budget_step: int = 1
) -> list[float]:
    """The curve to report (module docstring), one value per bucket of ``budget_step`` tokens."""
    if budget_step < 1 or k_max < 0:
        raise ValueError(f"need budget_step >= 1 and k_max >= 0, got {budget_step}, {k_max}")
    if running + waiting == 0 or k_max == 0:
        return []
    if rates is None or rates.numel() == 0:
        per_token = torch.full((k_max,), PRIOR_ACCEPTANCE, dtype=torch.float64)
    else:
        monotone = torch.cummin(rates.to(torch.float64).clamp(0.0, 1.0), dim=0).values
        per_token = monotone.repeat_interleave(max(running, 1))[:k_max]
        if per_token.numel() < k_max:
            tail = per_token[-1].expand(k_max - per_token.numel())
            per_token = torch.cat([per_token, tail])
    buckets = -(-k_max // budget_step)
    padded = torch.cat([per_token, per_token[-1].expand(buckets * budget_step - k_max)])
    return [float(v) for v in padded.view(buckets, budget_step).mean(dim=1)]
