"""The shm collectives over a real one-rank gloo process group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)
from sgl_kernel.collectives import REDUCE_OP_SUM

OPS = torch.ops.sgl_kernel


def test_reduce_op_sum_is_torch_distributed_sum() -> None:
    assert dist.ReduceOp.SUM.value == REDUCE_OP_SUM


@pytest.mark.parametrize(("size", "rank"), [(0, 0), (2, 2), (2, -1)])
def test_initialize_rejects_a_rank_outside_the_group(size: int, rank: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        OPS.initialize(size, rank)


def test_collectives_need_a_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    with pytest.raises(RuntimeError, match="process group"):
        OPS.shm_allreduce(torch.ones(2), REDUCE_OP_SUM)


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_group")
def test_collectives_over_one_rank_are_the_identity() -> None:
    OPS.initialize(1, 0)
    data = torch.arange(6, dtype=torch.float32).view(2, 3)
    OPS.shm_allreduce(data, REDUCE_OP_SUM)
    assert torch.equal(data, torch.arange(6, dtype=torch.float32).view(2, 3))
    assert torch.equal(OPS.shm_allgather(data, 1), data)
    with pytest.raises(ValueError, match="SUM"):
        OPS.shm_allreduce(data, REDUCE_OP_SUM + 1)
