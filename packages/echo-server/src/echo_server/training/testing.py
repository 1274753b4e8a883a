"""Synthetic heads, target feedback and self-distilled sequences: test and benchmark fixtures;
production code never imports this module (tests/test_import_hygiene.py checks it).

No real model is needed: a tiny randomly initialised head attached to a random tied embedding,
hand-built :class:`~echo_server.drafting.base.TargetFeedback`, and sequences whose continuation
is learnable (odd token ids stepping by 6, with features pointing at the next token).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_server.drafting.base import TargetFeedback
from echo_server.drafting.eagle_head import EagleHead, EagleHeadConfig
from echo_server.training.selfdistill import DistilledSequence

HIDDEN, VOCAB, DRAFT_VOCAB = 32, 50, 20


def tiny_config(aux_layers: tuple[int, ...] = ()) -> EagleHeadConfig:
    return EagleHeadConfig(
        hidden_size=HIDDEN,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=48,
        draft_vocab_size=DRAFT_VOCAB,
        target_vocab_size=VOCAB,
        target="tiny",
        aux_layers=aux_layers,
    )


def tiny_head(seed: int = 0, aux_layers: tuple[int, ...] = ()) -> EagleHead:
    """A randomly initialised, attached head (eval mode); draft ids are the odd target ids.
    With ``aux_layers`` its aux projection is random too (not the training-time zero init)."""
    torch.manual_seed(seed)
    head = EagleHead(tiny_config(aux_layers))
    if head.aux_fc is not None:
        torch.nn.init.normal_(head.aux_fc.weight, std=0.3)
    head.draft_ids.copy_(torch.arange(DRAFT_VOCAB) * 2 + 1)
    embed = torch.randn(VOCAB, HIDDEN)
    head.attach_target(embed, embed)
    return head.eval()


def feedback(
    requests: list[tuple[str, list[int], Tensor, int, int]], aux: tuple[Tensor, ...] = ()
) -> TargetFeedback:
    """Feedback for ``(request id, tokens, features [n, H], first position, next token)``;
    ``aux`` are the rows' aux features per layer ([R, H] each, all requests' rows in order)."""
    cu = [0]
    for _, toks, _, _, _ in requests:
        cu.append(cu[-1] + len(toks))
    return TargetFeedback(
        request_ids=[r[0] for r in requests],
        cu_rows=torch.tensor(cu, dtype=torch.int64),
        tokens=torch.tensor([t for r in requests for t in r[1]], dtype=torch.int64),
        positions=torch.tensor(
            [r[3] + i for r in requests for i in range(len(r[1]))], dtype=torch.int64
        ),
        hidden=torch.cat([r[2] for r in requests]),
        aux=aux,
        next_token=torch.tensor([r[4] for r in requests], dtype=torch.int64),
    )


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
