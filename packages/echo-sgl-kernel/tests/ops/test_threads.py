"""init_cpu_threads_env: the cpu-list parser and the thread/affinity setup (state restored)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)
from sgl_kernel.threads import parse_cpu_ids

OPS = torch.ops.sgl_kernel


@pytest.mark.parametrize(
    ("text", "cores"),
    [("0", [0]), ("0,1", [0, 1]), ("4-6,0", [0, 4, 5, 6]), (" 2 , 2-3 ", [2, 3]), ("0,", [0])],
)
def test_parse_cpu_ids_reads_lists_and_ranges(text: str, cores: list[int]) -> None:
    assert parse_cpu_ids(text) == cores


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-", "-2", ","])
def test_parse_cpu_ids_rejects_malformed_lists(text: str) -> None:
    with pytest.raises(ValueError, match="cpu list"):
        parse_cpu_ids(text)


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    affinity = os.sched_getaffinity(0)
    yield
    torch.set_num_threads(threads)
    os.sched_setaffinity(0, affinity)


@pytest.mark.usefixtures("restore_threads")
def test_init_cpu_threads_env_binds_to_allowed_cores() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    summary = OPS.init_cpu_threads_env(",".join(map(str, allowed)))
    assert torch.get_num_threads() == len(allowed)
    assert sorted(os.sched_getaffinity(0)) == allowed
    assert "bound to" in summary


@pytest.mark.usefixtures("restore_threads")
def test_init_cpu_threads_env_leaves_affinity_for_cores_outside_the_mask() -> None:
    before = os.sched_getaffinity(0)
    outside = max(before) + 4096
    summary = OPS.init_cpu_threads_env(f"{min(before)},{outside}")
    assert torch.get_num_threads() == 2
    assert os.sched_getaffinity(0) == before
    assert "not bound" in summary
