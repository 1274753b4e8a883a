"""SGLang's EAGLE draft pool as an echo-core candidate pool (the per-request score pool).

SGLang's EAGLE worker drafts ``S`` steps with top-k ``k`` and hands three lists to
``organize_draft_results``; concatenated (:func:`concat_draft_lists`) they are, per request:

- ``scores`` [B, M] float, ``M = k + (S - 1) k^2``: the path probability of every candidate.
  Candidate ``s < k`` is the root's child of rank ``s``; step ``i >= 1`` owns the ``k^2``
  candidates ``k + (i - 1) k^2 + r k + c``, child ``c`` of the step's ``r``-th expanded node;
- ``tokens`` [B, M] int64: the candidates' token ids (target vocabulary);
- ``parents`` [B, P] int64, ``P = 1 + (S - 1) k`` (0 when ``S = 1``): ``parents[1 + j]`` is the
  candidate index of the ``j``-th expanded node, in step order.

So the parent of candidate ``s`` is the root when ``s // k == 0``, else candidate
``parents[s // k]``; its child rank is ``s % k`` (the convention of SGLang's tree-building
kernel, ``build_tree_kernel_efficient``).

The pool keeps every candidate, re-ordered the way echo-scheduler's policies expect (by depth,
then parent, then rank), with ``path_logprob = log score`` and ``draft_logprob`` the difference to
the parent's. ``flat_index`` maps each pool node back to its candidate index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import ROOT, TreeBatch
from echo_sglang.args import PluginConfigError

MIN_SCORE = 1e-30
"""Scores are clamped here before the log, so an underflowed path stays finite."""


@dataclass(frozen=True, slots=True)
class EaglePool:
    """The candidate pool of one EAGLE draft (module docstring)."""

    tree: TreeBatch  # every candidate, per request in (depth, parent, rank) order
    flat_index: Tensor  # [N] int64, the node's candidate index in SGLang's lists
    rank: Tensor  # [N] int64, child rank under its parent (0 = the drafter's best)
    topk: int
    num_steps: int


def concat_draft_lists(
    score_list: Sequence[Tensor], token_list: Sequence[Tensor], parents_list: Sequence[Tensor]
) -> tuple[Tensor, Tensor, Tensor]:
    """``(scores [B, M], tokens [B, M], parents [B, P])`` from the per-step lists, as
    ``organize_draft_results`` concatenates them."""
    scores = torch.cat(list(score_list), dim=1).flatten(1)
    tokens = torch.cat(list(token_list), dim=1)
    if len(parents_list) > 1:
        parents = torch.cat(list(parents_list[:-1]), dim=1)
    else:
        parents = torch.empty(tokens.shape[0], 0, dtype=torch.int64, device=tokens.device)
    return scores, tokens, parents


def pool_from_eagle(scores: Tensor, tokens: Tensor, parents: Tensor, topk: int) -> EaglePool:
    """Build the pool; scores [B, M] float, tokens [B, M] int64, parents [B, P] int64."""
    b, m = tokens.shape
    steps = _check_shapes(scores, tokens, parents, topk)
    dev = tokens.device
    flat = torch.arange(m, device=dev)
    depth = torch.where(flat < topk, 1, 2 + (flat - topk).clamp(min=0) // (topk * topk))
    slot = flat // topk  # [M], 0 = the root, else an index into parents
    if parents.shape[1]:
        parent_flat = parents.gather(1, slot.clamp(max=parents.shape[1] - 1).expand(b, m))
    else:
        parent_flat = torch.zeros(b, m, dtype=torch.int64, device=dev)
    parent_flat = torch.where(slot == 0, ROOT, parent_flat)  # [B, M]
    # New position of every candidate, one depth at a time (a parent is placed before its
    # children are sorted): key = (parent's position, child rank).
    position = torch.empty(b, m, dtype=torch.int64, device=dev)
    position[:, :topk] = flat[:topk]
    for i in range(1, steps):
        lo, hi = topk + (i - 1) * topk * topk, topk + i * topk * topk
        parent_pos = position.gather(1, parent_flat[:, lo:hi])
        key = parent_pos * topk + flat[lo:hi] % topk
        order = torch.argsort(key, dim=1, stable=True)
        position[:, lo:hi].scatter_(1, order, lo + flat[: hi - lo].expand(b, -1))
    perm = torch.empty_like(position)  # perm[b, new] = candidate index
    perm.scatter_(1, position, flat.expand(b, m))
    log_score = log_scores(scores)
    parent_pos = torch.where(
        parent_flat >= 0, position.gather(1, parent_flat.clamp(min=0)), ROOT
    )  # [B, M], by candidate index
    parent_log = torch.where(parent_flat >= 0, log_score.gather(1, parent_flat.clamp(min=0)), 0.0)
    path = log_score.gather(1, perm)
    tree = TreeBatch(
        cu_nodes=torch.arange(b + 1, device=dev, dtype=torch.int64) * m,
        token=tokens.gather(1, perm).to(torch.int64).flatten(),
        parent=parent_pos.gather(1, perm).flatten(),
        depth=depth[perm].flatten(),
        draft_logprob=(path - parent_log.gather(1, perm)).flatten(),
        path_logprob=path.flatten(),
    )
    return EaglePool(tree, perm.flatten(), (perm % topk).flatten(), topk, steps)


def log_scores(scores: Tensor) -> Tensor:
    """``log max(score, MIN_SCORE)`` in float32: every candidate's path log-probability."""
    return scores.to(torch.float32).clamp(min=MIN_SCORE).log()


def _check_shapes(scores: Tensor, tokens: Tensor, parents: Tensor, topk: int) -> int:
    """The number of steps S; raise PluginConfigError naming the first inconsistency."""
    if topk < 1:
        raise PluginConfigError(f"topk must be >= 1, got {topk}")
    if tokens.dim() != 2 or scores.shape != tokens.shape or parents.dim() != 2:
        raise PluginConfigError(
            f"scores and tokens must be matching [B, M], parents [B, P]; got "
            f"{tuple(scores.shape)}, {tuple(tokens.shape)}, {tuple(parents.shape)}"
        )
    m = tokens.shape[1]
    if m < topk or (m - topk) % (topk * topk):
        raise PluginConfigError(f"M={m} candidates is not k + (S - 1) k^2 for k={topk}")
    steps = 1 + (m - topk) // (topk * topk)
    want = 0 if steps == 1 else 1 + (steps - 1) * topk
    if parents.shape[0] != tokens.shape[0] or parents.shape[1] != want:
        raise PluginConfigError(
            f"parents must be [B={tokens.shape[0]}, {want}] for {steps} steps at k={topk}, "
            f"got {tuple(parents.shape)}"
        )
    return steps
