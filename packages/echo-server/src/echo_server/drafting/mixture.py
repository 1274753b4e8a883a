"""Two drafters proposing into one tree: the learned head and prompt lookup, scored by the best.

Every expanded node asks both drafters for its top-k children. A token proposed by both keeps
the higher score; each node keeps its ``k`` best children by

    s(t) = max(log q_a(t), log q_b(t))          (a missing proposal counts as -inf)

so a node's children are the union of the two top-k lists, cut back to k. ``s`` is not a
normalised distribution, it is a confidence: a head-only token keeps the head's log-probability,
which is what the calibrated acceptance maps and gates were fitted on, and a prompt-lookup token
brings lookup's evidence (one earlier occurrence 0.5, three agreeing 0.75, see drafting/ngram.py).
Code copies spans of its prompt that a small head predicts poorly; chat does the opposite, so
the union drafts well on both. Either drafter may continue the other's tokens: the head runs on
any path (it fuses the parent's feature with whatever token the node holds).

Verification does not depend on the scores, so greedy output stays exactly plain decoding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from echo_server.drafting.base import Drafter, ExpandRequest, Proposals, TargetFeedback


class MixtureDrafter:
    """Union of two drafters' top-k proposals per node (module docstring)."""

    def __init__(self, first: Drafter, second: Drafter) -> None:
        self.first, self.second = first, second
        self.name = f"{first.name}+{second.name}"
        self.aux_layers = tuple(sorted({*first.aux_layers, *second.aux_layers}))
        # Per drafter, the positions of its layers in the union (None: it reads the union).
        index = {layer: i for i, layer in enumerate(self.aux_layers)}
        self._picks = [
            None if d.aux_layers == self.aux_layers else [index[x] for x in d.aux_layers]
            for d in (first, second)
        ]

    def observe(self, feedback: TargetFeedback) -> None:
        """Each drafter gets the aux features of its own ``aux_layers`` (the engine sends the
        union, in increasing layer order)."""
        for drafter, picks in zip((self.first, self.second), self._picks, strict=True):
            if picks is None:
                drafter.observe(feedback)
            else:
                drafter.observe(replace(feedback, aux=tuple(feedback.aux[i] for i in picks)))

    def begin_step(self, contexts: Sequence[Sequence[int]], request_ids: Sequence[str]) -> None:
        self.first.begin_step(contexts, request_ids)
        self.second.begin_step(contexts, request_ids)

    def expand(self, nodes: ExpandRequest) -> Proposals:
        best: list[dict[int, float]] = [{} for _ in range(int(nodes.topk.numel()))]
        for proposals in (self.first.expand(nodes), self.second.expand(nodes)):
            rows = zip(
                proposals.source.tolist(),
                proposals.token.tolist(),
                proposals.logprob.tolist(),
                strict=True,
            )
            for m, tok, lp in rows:
                if lp > best[m].get(tok, -float("inf")):
                    best[m][tok] = lp
        source: list[int] = []
        token: list[int] = []
        logprob: list[float] = []
        for m, (scores, k) in enumerate(zip(best, nodes.topk.tolist(), strict=True)):
            ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]
            for tok, lp in ranked:
                source.append(m)
                token.append(tok)
                logprob.append(lp)
        host = torch.device("cpu")  # merged on the host; the engine moves them once per depth
        return Proposals(
            source=torch.tensor(source, dtype=torch.int64, device=host),
            token=torch.tensor(token, dtype=torch.int64, device=host),
            logprob=torch.tensor(logprob, dtype=torch.float32, device=host),
        )

    def release(self, request_id: str) -> None:
        self.first.release(request_id)
        self.second.release(request_id)
