"""Shared test setup for echo-gating."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread() -> Iterator[None]:
    """Run each test module on one intra-op thread, restoring the previous setting afterwards.

    The inputs here are small: on a shared 2-core machine a second thread only adds contention
    (calibration ran 3-5x slower with two threads under load).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
