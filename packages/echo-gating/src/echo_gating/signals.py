"""Confidence signals of a candidate pool, batched over requests (no per-request Python loops).

Formulas (``P`` = path score, ``q`` = draft distribution at a node's parent):

- path score of node i: ``P_i = prod_{a on root->i} q(a) = exp(path_logprob_i)``;
- layer confidence of request b at depth d: ``C_b(d) = max_{i in b, depth_i = d} P_i``, and
  ``C_b(d) = 0`` when b has no depth-d node (the gate then truncates it unless its threshold is 0);
- draft entropy at a node's parent: ``H = -sum_v q(v) log q(v)`` (nats);
- top-2 margin at a node's parent: ``q_(1) - q_(2)``, the gap between the two most likely tokens;
- sibling margin of request b at depth d (a gate signal the ranking key does not hold: the key
  sees each node's own path score, not its rivals): take b's best depth-d node i* (highest
  ``P_i``, ties to the largest margin) and its drafted siblings S (the children of its parent,
  i* included); ``M_b(d) = q_(1) - q_(2)`` over ``{q(a) : a in S}``, with ``q_(2) = 0`` for an
  only child and ``M_b(d) = 0`` when b has no depth-d node. It equals ``top2_margin`` of the
  parent's draft distribution whenever the drafter kept at least its two best children.

Worked example: request 0 has depth-1 nodes with draft log-probs ``log 0.6`` and ``log 0.3`` and a
depth-2 child of the first with ``log 0.5``; request 1 is empty. Then
``depth_confidences = [[0.6, 0.3], [0.0, 0.0]]`` and ``layer_confidence(pool, 2) = [0.3, 0.0]``.

The max is a segment max computed with ``scatter_reduce(amax)`` over the flat index
``b * D + (d - 1)``; probabilities are >= 0, so a zero-initialised output gives the 0.0 default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.errors import GatingError


def depth_confidences(pool: TreeBatch, max_depth: int | None = None) -> Tensor:
    """Layer confidence of every request at every depth: [B, D] float32, D = ``max_depth``.

    ``max_depth`` defaults to the pool's deepest node; nodes deeper than it are ignored.
    """
    depth_cols = pool.max_depth() if max_depth is None else max_depth
    if depth_cols < 0:
        raise GatingError(f"max_depth must be >= 0, got {depth_cols}")
    batch = pool.batch_size
    out = torch.zeros(batch * depth_cols, dtype=torch.float32, device=pool.device)
    if pool.num_nodes == 0 or depth_cols == 0:
        return out.view(batch, depth_cols)
    keep = pool.depth <= depth_cols
    flat = pool.request_index()[keep] * depth_cols + (pool.depth[keep] - 1)  # [N'] int64
    prob = pool.path_logprob[keep].to(torch.float32).exp()  # [N'] float32
    out.scatter_reduce_(0, flat, prob, reduce="amax", include_self=True)
    return out.view(batch, depth_cols)


def layer_confidence(pool: TreeBatch, depth: int) -> Tensor:
    """Layer confidence ``C_b(depth)`` of every request: [B] float32, 0.0 without such nodes."""
    if depth < 1:
        raise GatingError(f"depth must be >= 1 (root children have depth 1), got {depth}")
    out = torch.zeros(pool.batch_size, dtype=torch.float32, device=pool.device)
    mask = pool.depth == depth  # [N] bool
    prob = pool.path_logprob[mask].to(torch.float32).exp()
    out.scatter_reduce_(0, pool.request_index()[mask], prob, reduce="amax", include_self=True)
    return out


def node_layer_confidence(pool: TreeBatch) -> Tensor:
    """For every node, its request's layer confidence at the node's depth: [N] float32.

    This is the ``layer_confidence`` column of a warm-up record.
    """
    if pool.num_nodes == 0:
        return torch.zeros(0, dtype=torch.float32, device=pool.device)
    table = depth_confidences(pool)  # [B, D]
    return table[pool.request_index(), pool.depth - 1]


def sibling_margin(pool: TreeBatch, depth: int) -> Tensor:
    """Sibling margin ``M_b(depth)`` of every request (module docstring): [B] float32 in [0, 1]."""
    if depth < 1:
        raise GatingError(f"depth must be >= 1 (root children have depth 1), got {depth}")
    b, n = pool.batch_size, pool.num_nodes
    out = torch.zeros(b, dtype=torch.float32, device=pool.device)
    idx = (pool.depth == depth).nonzero().squeeze(1)
    if idx.numel() == 0:
        return out
    req = pool.request_index()[idx]
    gp = pool.global_parent()[idx]
    group = torch.where(gp >= 0, gp, n + req)  # siblings share a parent (or the request's root)
    q = pool.draft_logprob[idx].to(torch.float32).exp()
    first = torch.zeros(n + b, dtype=torch.float32, device=pool.device)
    first.scatter_reduce_(0, group, q, reduce="amax", include_self=True)
    is_top = q >= first[group]
    tops = torch.zeros(n + b, dtype=torch.int64, device=pool.device).index_add_(
        0, group, is_top.to(torch.int64)
    )
    second = torch.zeros(n + b, dtype=torch.float32, device=pool.device)
    second.scatter_reduce_(0, group, torch.where(is_top, 0.0, q), reduce="amax", include_self=True)
    second = torch.where(tops > 1, first, second)  # a tie for first: margin 0
    margin = (first - second)[group]  # [n_d], the margin of each node's sibling group
    path = pool.path_logprob[idx].to(torch.float32)
    best = torch.full((b,), -torch.inf, dtype=torch.float32, device=pool.device)
    best.scatter_reduce_(0, req, path, reduce="amax", include_self=True)
    at_best = path >= best[req]
    out.scatter_reduce_(0, req, torch.where(at_best, margin, 0.0), reduce="amax", include_self=True)
    return out


DEFAULT_SIGNAL = "layer_confidence"
"""What a gate thresholds unless its policy names another signal."""
GATE_SIGNALS = {DEFAULT_SIGNAL: layer_confidence, "sibling_margin": sibling_margin}
"""Per-request signals a gate may threshold at a checkpoint: name -> f(pool, depth) -> [B]."""


def gate_signal(pool: TreeBatch, depth: int, name: str) -> Tensor:
    """The gate signal ``name`` of every request at ``depth``: [B] float32 in [0, 1]."""
    try:
        fn = GATE_SIGNALS[name]
    except KeyError:
        raise GatingError(f"unknown gate signal {name!r}; known: {sorted(GATE_SIGNALS)}") from None
    return fn(pool, depth)


def draft_entropy(logprobs: Tensor) -> Tensor:
    """Entropy in nats of each row's draft distribution.

    ``logprobs``: [N, V] float, log-softmax output (rows sum to 1 in probability). Returns [N]
    float32. ``-inf`` entries (masked tokens) contribute 0.
    """
    _check_rows(logprobs, "logprobs")
    lp = logprobs.to(torch.float32)
    p = lp.exp()
    return -(p * torch.where(p > 0, lp, torch.zeros_like(lp))).sum(dim=-1)


def top2_margin(logprobs: Tensor) -> Tensor:
    """``q_(1) - q_(2)`` of each row's draft distribution: [N, V] float -> [N] float32 in [0, 1].

    A vocabulary of one token has margin ``q_(1)``.
    """
    _check_rows(logprobs, "logprobs")
    p = logprobs.to(torch.float32).exp()
    if p.shape[-1] == 1:
        return p[:, 0]
    top = torch.topk(p, 2, dim=-1).values  # [N, 2]
    return top[:, 0] - top[:, 1]


def _check_rows(t: Tensor, name: str) -> None:
    if t.dim() != 2 or t.shape[-1] < 1 or not t.is_floating_point():
        raise GatingError(
            f"{name} must be a [N, V] float tensor with V >= 1, got {tuple(t.shape)} {t.dtype}"
        )
