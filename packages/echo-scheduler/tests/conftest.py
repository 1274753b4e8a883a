"""Test settings for echo-scheduler: one intra-op thread while these tests run.

The tensors here are tiny; on a shared 2-core machine torch's thread pool costs far more than it
gains (measured: one policy step 20x slower with the default pool under load). The previous
setting is restored afterwards, so other packages' tests in the same session are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
