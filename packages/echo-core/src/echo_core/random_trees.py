"""Seeded random tree batches, for tests and benchmarks of every package.

Trees are built the way a drafter builds them: each new node picks a random earlier node (or the
root) as its parent, draws a token from ``[0, vocab)`` and a draft log-prob ``log u`` with
``u ~ U(0.05, 1)``; depths and path log-probs follow, so every result passes validation.
"""

from __future__ import annotations

import torch

from echo_core.tree import ROOT, TreeBatch, make_tree


def random_tree_batch(
    generator: torch.Generator,
    batch_size: int,
    max_nodes: int,
    vocab: int = 16,
    allow_empty: bool = True,
    max_depth: int | None = None,
) -> TreeBatch:
    """A random valid batch: request sizes uniform in ``[0 or 1, max_nodes]``."""
    per_request: list[list[tuple[int, int, float]]] = []
    low = 0 if allow_empty else 1
    for _ in range(batch_size):
        n = int(torch.randint(low, max_nodes + 1, (1,), generator=generator))
        nodes: list[tuple[int, int, float]] = []
        depth: list[int] = []
        for i in range(n):
            choices = [ROOT] + [j for j in range(i) if max_depth is None or depth[j] < max_depth]
            parent = choices[int(torch.randint(0, len(choices), (1,), generator=generator))]
            depth.append(1 if parent == ROOT else depth[parent] + 1)
            token = int(torch.randint(0, vocab, (1,), generator=generator))
            u = 0.05 + 0.95 * float(torch.rand(1, generator=generator))
            nodes.append((token, parent, float(torch.log(torch.tensor(u)))))
        per_request.append(nodes)
    return make_tree(per_request)
