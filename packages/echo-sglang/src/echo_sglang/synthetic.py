"""Seeded synthetic inputs for the plugin's tests and benchmarks: EAGLE drafts, super-trees,
target outputs.

:func:`eagle_draft` reproduces what SGLang's EAGLE draft loop hands to ``organize_draft_results``
(``select_top_k_tokens`` in ``sglang/srt/speculative/spec_utils.py``) for random draft
distributions: step 0 keeps the root's top-k; step ``i`` scores the ``k x k`` children of the
frontier by path probability and expands the best ``k`` of them next. :func:`eagle2_selection`
is SGLang's own EAGLE-2 choice from that pool (``organize_draft_results``: the ``N - 1`` best
scores per request, sorted by candidate index).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_core.random_trees import random_tree_batch
from echo_core.tree import TreeBatch, make_tree
from echo_core.verify_rows import parent_rows, verify_offsets

EagleLists = tuple[list[Tensor], list[Tensor], list[Tensor]]


def eagle_draft(
    generator: torch.Generator, batch: int, steps: int, topk: int, vocab: int = 64
) -> EagleLists:
    """``(score_list, token_list, parents_list)`` of one EAGLE draft (module docstring)."""
    scores_out: list[Tensor] = []
    tokens_out: list[Tensor] = []
    parents_out: list[Tensor] = []
    p, tok = _draft_topk(generator, batch, topk, vocab)  # [B, k] each
    scores_out.append(p.unsqueeze(1))
    tokens_out.append(tok)
    parents_out.append(torch.arange(-1, topk, dtype=torch.int64).expand(batch, -1))
    frontier_score = p  # [B, k]
    for i in range(1, steps):
        cp, ctok = _draft_topk(generator, batch * topk, topk, vocab)  # children of the frontier
        expand = frontier_score.unsqueeze(2) * cp.view(batch, topk, topk)  # [B, k, k]
        best = torch.topk(expand.flatten(1), topk, dim=-1)
        scores_out.append(expand)
        tokens_out.append(ctok.view(batch, topk * topk))
        parents_out.append(best.indices + topk * topk * (i - 1) + topk)
        frontier_score = best.values
    return scores_out, tokens_out, parents_out


def _draft_topk(
    generator: torch.Generator, rows: int, topk: int, vocab: int
) -> tuple[Tensor, Tensor]:
    logits = torch.randn(rows, vocab, generator=generator) * 3.0
    p, tok = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    return p, tok.to(torch.int64)


def eagle2_selection(scores: Tensor, num_draft_tokens: int) -> Tensor:
    """SGLang's EAGLE-2 tree: the ``N - 1`` best candidates per request, ascending index."""
    top = torch.topk(scores, num_draft_tokens - 1, dim=-1).indices
    return torch.sort(top).values


def distinct_sibling_tree(
    generator: torch.Generator, batch: int, max_nodes: int, vocab: int = 16
) -> TreeBatch:
    """A random tree batch whose siblings carry distinct tokens (as any top-k drafter's do)."""
    if vocab < max_nodes:
        raise ValueError(f"vocab={vocab} cannot give {max_nodes} siblings distinct tokens")
    shape = random_tree_batch(generator, batch, max_nodes, vocab=vocab)
    per_request: list[list[tuple[int, int, float]]] = []
    for b in range(batch):
        req = shape.request(b)
        free: dict[int, list[int]] = {}  # parent -> tokens its next children take, in order
        nodes = []
        for par, lp in zip(req.parent.tolist(), req.draft_logprob.tolist(), strict=True):
            if par not in free:
                free[par] = torch.randperm(vocab, generator=generator).tolist()
            nodes.append((free[par].pop(), par, lp))
        per_request.append(nodes)
    return make_tree(per_request)


def following_targets(
    tree: TreeBatch, generator: torch.Generator, follow: float = 0.8, vocab: int = 16
) -> Tensor:
    """Target argmax per verify row [B + N] int64: with probability ``follow`` one of the row's
    children's tokens (so acceptance goes deep), else a random token."""
    rows = tree.batch_size + tree.num_nodes
    target = torch.randint(0, vocab, (rows,), generator=generator)
    parent_row = parent_rows(tree)  # [N]
    for row in range(rows):
        children = (parent_row == row).nonzero().squeeze(1)
        if children.numel() and float(torch.rand(1, generator=generator)) < follow:
            pick = children[int(torch.randint(0, children.numel(), (1,), generator=generator))]
            target[row] = tree.token[pick]
    return target


def padded_targets(tree: TreeBatch, target: Tensor, num_draft_tokens: int) -> Tensor:
    """``target`` ([B + N], echo-core's verify-row order) at SGLang's padded slots ``b T + j``:
    [B T] int64, padding slots -5 (a token no draft holds)."""
    b, t = tree.batch_size, num_draft_tokens
    cu = verify_offsets(tree)
    out = torch.full((b * t,), -5, dtype=torch.int64)
    for i in range(b):
        out[i * t : i * t + int(cu[i + 1] - cu[i])] = target[cu[i] : cu[i + 1]]
    return out
