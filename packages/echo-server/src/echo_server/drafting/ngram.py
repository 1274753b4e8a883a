"""Model-free n-gram (prompt-lookup) drafter over each request's own context.

For a node whose root-to-node text is ``s = context + path``, the drafter looks for earlier
occurrences of the longest suffix of ``s`` of length ``n`` in ``[min_n, max_n]`` inside the
request's context and counts the tokens that followed them. With counts ``c(t)`` and total
``C = sum_t c(t)``, the draft distribution is

    q(t) = c(t) / (C + alpha)

The ``alpha`` mass is held back for "something not seen": one earlier occurrence gives
``q = 1 / (1 + alpha)`` (0.5 with the default), three agreeing ones 0.75, so repeated evidence
earns confidence, which is what the gates and the budget ranking read. Example: context
``a b c a b`` with max_n 2: suffix ``a b`` occurred once, followed by ``c``: q(c) = 0.5.

Index: per request, for every ``n`` a dict from n-gram to the counts of its next tokens, updated
incrementally as tokens are committed (O(max_n) per new token).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from echo_server.drafting.base import ExpandRequest, Proposals, TargetFeedback


@dataclass(slots=True)
class _RequestIndex:
    tokens: list[int] = field(default_factory=list)
    # n -> n-gram -> counts of the token that followed it
    table: dict[int, dict[tuple[int, ...], Counter[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(Counter))
    )


class NgramDrafter:
    """Prompt-lookup drafter; see the module docstring for the distribution."""

    name = "ngram"
    aux_layers: tuple[int, ...] = ()

    def __init__(self, max_n: int = 4, min_n: int = 1, alpha: float = 1.0) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n} max_n={max_n}")
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        self.max_n, self.min_n, self.alpha = max_n, min_n, alpha
        self._index: dict[str, _RequestIndex] = {}
        self._active: list[_RequestIndex] = []

    def begin_step(self, contexts: Sequence[Sequence[int]], request_ids: Sequence[str]) -> None:
        self._active = []
        for rid, ctx in zip(request_ids, contexts, strict=True):
            index = self._index.setdefault(rid, _RequestIndex())
            if index.tokens != list(ctx[: len(index.tokens)]):
                index = self._index[rid] = _RequestIndex()  # context rewritten: rebuild
            for tok in ctx[len(index.tokens) :]:
                self._append(index, int(tok))
            self._active.append(index)

    def _append(self, index: _RequestIndex, token: int) -> None:
        toks = index.tokens
        for n in range(self.min_n, self.max_n + 1):
            if len(toks) >= n:
                index.table[n][tuple(toks[-n:])][token] += 1
        toks.append(token)

    def _lookup(self, index: _RequestIndex, path: Sequence[int]) -> Counter[int] | None:
        tail = (index.tokens[-self.max_n :] + list(path))[-self.max_n :]
        for n in range(min(self.max_n, len(tail)), self.min_n - 1, -1):
            counts = index.table[n].get(tuple(tail[-n:]))
            if counts:
                return counts
        return None

    def expand(self, nodes: ExpandRequest) -> Proposals:
        source: list[int] = []
        token: list[int] = []
        logprob: list[float] = []
        for m, (b, k) in enumerate(zip(nodes.request.tolist(), nodes.topk.tolist(), strict=True)):
            counts = self._lookup(self._active[b], nodes.path[m])
            if counts is None:
                continue
            denom = sum(counts.values()) + self.alpha
            for tok, c in counts.most_common(k):
                source.append(m)
                token.append(tok)
                logprob.append(math.log(c / denom))
        host = torch.device("cpu")  # a host drafter: the engine moves proposals once per depth
        return Proposals(
            source=torch.tensor(source, dtype=torch.int64, device=host),
            token=torch.tensor(token, dtype=torch.int64, device=host),
            logprob=torch.tensor(logprob, dtype=torch.float32, device=host),
        )

    def observe(self, feedback: TargetFeedback) -> None:
        """Model-free: the context arrives through :meth:`begin_step`."""

    def release(self, request_id: str) -> None:
        self._index.pop(request_id, None)
