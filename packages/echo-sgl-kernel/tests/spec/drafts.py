"""Random EAGLE drafts and trees for the speculative-op tests (test-side only).

``eagle_draft`` plays SGLang's multi-step top-k draft with random probabilities and returns the
two tensors its tree builder reads: ``parent_list`` (the score entry of every beam, beam 0 the
root) and ``selected_index`` (the T - 1 best score entries, sorted). Score entries are numbered
as SGLang concatenates them: step 0 has ``topk`` entries, each later step ``topk * topk`` (beam r
of the previous step times its ``topk`` children), so entry e has parent beam ``e // topk``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def eagle_draft(
    gen: torch.Generator, batch: int, topk: int, steps: int, num_nodes: int
) -> tuple[Tensor, Tensor]:
    """``(parent_list [B, topk (steps - 1) + 1], selected_index [B, num_nodes - 1])``, int64.

    Child scores are the parent's score times a probability in (0, 1), so a selected entry's
    parent always scores higher and is selected too: every tree is connected.
    """
    if num_nodes - 1 > topk + (steps - 1) * topk * topk:
        raise ValueError(f"{num_nodes} nodes do not fit {steps} steps of top-{topk}")
    beam_scores = torch.rand((batch, topk), generator=gen) * 0.9 + 0.05
    scores = [beam_scores]
    parents = [torch.arange(-1, topk).expand(batch, -1)]
    for step in range(1, steps):
        child = beam_scores.unsqueeze(2) * (
            torch.rand((batch, topk, topk), generator=gen) * 0.9 + 0.05
        )
        flat = child.flatten(1)
        beam_scores, entry = flat.topk(topk, dim=1)
        scores.append(flat)
        parents.append(entry + topk + topk * topk * (step - 1))
    parent_list = (
        torch.cat(parents[:-1], dim=1) if steps > 1 else torch.empty((batch, 0), dtype=torch.int64)
    )
    selected = torch.cat(scores, dim=1).topk(num_nodes - 1, dim=1).indices.sort(dim=1).values
    return parent_list.contiguous(), selected


def tree_parents(parent_list: Tensor, selected_index: Tensor, topk: int) -> list[list[int]]:
    """Parent node of every node of every request, by a plain search (-1 for the root)."""
    out = []
    for beams, chosen in zip(parent_list.tolist(), selected_index.tolist(), strict=True):
        parents = [-1]
        for entry in chosen:
            beam = entry // topk
            parents.append(0 if beam == 0 else chosen.index(beams[beam]) + 1)
        out.append(parents)
    return out


def random_parents(gen: torch.Generator, batch: int, num_nodes: int) -> list[list[int]]:
    """Random trees in topological order: node i > 0 hangs under a node < i."""
    return [
        [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, num_nodes)]
        for _ in range(batch)
    ]


def ancestor_mask(parents: list[list[int]]) -> Tensor:
    """QLEN_ONLY mask [B * T * T] bool: row i marks i and all its ancestors."""
    t = len(parents[0])
    mask = torch.zeros((len(parents), t, t), dtype=torch.bool)
    for b, par in enumerate(parents):
        for i in range(t):
            node = i
            while node >= 0:
                mask[b, i, node] = True
                node = par[node]
    return mask.view(-1)
