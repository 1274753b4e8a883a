"""Self-distilled sequences for training tests: fixtures; production code never imports this
module (tests/test_import_hygiene.py checks it). The tiny heads and feedback come from
:mod:`echo_server.drafting.testing`.

Sequences step through odd token ids by 6 (a learnable continuation), with features pointing at
the next token when a tied embedding is given.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_lab.training.selfdistill import DistilledSequence
from echo_server.drafting.testing import (
    DRAFT_VOCAB,
    HIDDEN,
    VOCAB,
    feedback,
    tiny_config,
    tiny_head,
)

__all__ = ["DRAFT_VOCAB", "HIDDEN", "VOCAB", "feedback", "sequences", "tiny_config", "tiny_head"]


def sequences(
    count: int, hidden: int, vocab: int, seed: int = 0, embed: Tensor | None = None
) -> list[DistilledSequence]:
    """Sequences stepping through odd token ids by 6 (a learnable continuation).

    With ``embed`` ([vocab, hidden], tied) the features imitate a target whose argmax is the next
    token, ``f_t = 4 e(x_{t+1})``; otherwise they are noise.
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        prompt = int(torch.randint(3, 8, (1,), generator=g))
        length = prompt + int(torch.randint(6, 14, (1,), generator=g))
        start = int(torch.randint(0, vocab // 2, (1,), generator=g))
        tokens = [(2 * (start + 3 * j) + 1) % vocab for j in range(length + 1)]
        if embed is None:
            feats = torch.randn(length, hidden, generator=g)
        else:
            feats = 4 * embed[torch.tensor(tokens[1:])]
        out.append(DistilledSequence(f"p/{i}", tokens, feats.to(torch.float16), prompt))
    return out
