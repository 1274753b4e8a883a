"""Synthetic draft heads and target feedback: test and benchmark fixtures;
production code never imports this module (tests/test_import_hygiene.py checks it).

No real model is needed: a tiny randomly initialised head attached to a random tied embedding,
hand-built :class:`~echo_server.drafting.base.TargetFeedback`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_server.drafting.base import TargetFeedback
from echo_server.drafting.eagle_head import EagleHead, EagleHeadConfig

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
