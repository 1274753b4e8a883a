"""Model-test fixtures: one torch thread, and transformers' reference of the embedded model.

``smollm`` (our fp32 SmolLM2-135M, session-scoped) comes from ``tests/conftest.py``; the HF
reference is loaded once per session too (about 10-15 s on the 2-core CI machines).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from echo_server.model import LoadedModel

from .reference import load_hf_reference


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread per test module, restored afterwards.

    On the shared 2-core machines two OpenMP threads stall whenever another process holds a
    core: a 24-token greedy run of SmolLM2 measured 2 s with one thread and 19-38 s with two.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def hf_smollm(smollm: LoadedModel) -> Any:
    return load_hf_reference(smollm.source)
