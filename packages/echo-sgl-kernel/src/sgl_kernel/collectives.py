"""The tensor-parallel collectives SGLang's CPU path routes through sgl_kernel.

The compiled library runs them over a /dev/shm segment shared by the ranks of one node; here
they run over torch.distributed's default process group (gloo on CPU), which SGLang has set up
for the same ranks by the time it calls them. SGLang only calls them with more than one rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sgl_kernel.library import NO_TENSOR_KEY, register

__all__ = ["REDUCE_OP_SUM", "initialize", "shm_allgather", "shm_allreduce"]

REDUCE_OP_SUM = 0
"""int(torch.distributed.ReduceOp.SUM): the reduce_op SGLang passes (its REDUCE_OP_SUM)."""


def initialize(size: int, rank: int) -> None:
    """Validate the (world size, rank) SGLang announces; there is no segment to create."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in a group of size {size}")


def _require_group() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("shm collectives need torch.distributed's default process group")


def shm_allreduce(data: torch.Tensor, reduce_op: int) -> None:
    """In place: data <- sum over ranks of data. ``reduce_op`` must be REDUCE_OP_SUM."""
    if reduce_op != REDUCE_OP_SUM:
        raise ValueError(f"only ReduceOp.SUM ({REDUCE_OP_SUM}) is supported, got {reduce_op}")
    _require_group()
    dist.all_reduce(data, op=dist.ReduceOp.SUM)


def shm_allgather(data: torch.Tensor, dim: int) -> torch.Tensor:
    """Concatenate every rank's ``data`` along ``dim``, in rank order."""
    _require_group()
    parts = [torch.empty_like(data) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, data.contiguous())
    return torch.cat(parts, dim=dim)


register("initialize(int size, int rank) -> ()", initialize, dispatch_key=NO_TENSOR_KEY)
register("shm_allreduce(Tensor(a!) data, int reduce_op) -> ()", shm_allreduce)
register("shm_allgather(Tensor data, int dim) -> Tensor", shm_allgather)
