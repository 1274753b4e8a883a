"""OpenMP thread setup for a CPU worker: ``init_cpu_threads_env``.

The compiled op pins one OpenMP thread to each listed core. From Python the closest equivalent
is to size torch's intra-op pool to the core count and restrict the calling thread to those
cores: the pool's threads, created from it, inherit the mask (they share the set instead of
owning one core each).
"""

from __future__ import annotations

import os

import torch

from sgl_kernel.library import NO_TENSOR_KEY, register

__all__ = ["init_cpu_threads_env", "parse_cpu_ids"]


def parse_cpu_ids(cpu_ids: str) -> list[int]:
    """Parse a Linux cpu list ("0-3,8,10-11") into sorted, distinct core ids.

    >>> parse_cpu_ids("4-5,0,2")
    [0, 2, 4, 5]
    """
    cores: set[int] = set()
    for part in cpu_ids.replace(" ", "").split(","):
        if not part:
            continue
        first, sep, last = part.partition("-")
        if not first.isdigit() or (sep and not last.isdigit()):
            raise ValueError(f"bad cpu list {cpu_ids!r}: {part!r} is not N or N-M")
        lo, hi = int(first), int(last) if sep else int(first)
        if hi < lo:
            raise ValueError(f"bad cpu list {cpu_ids!r}: range {part!r} runs backwards")
        cores.update(range(lo, hi + 1))
    if not cores:
        raise ValueError(f"cpu list {cpu_ids!r} names no cores")
    return sorted(cores)


def init_cpu_threads_env(cpu_ids: str) -> str:
    """Use len(cores) intra-op threads on ``cpu_ids``; returns a one-line summary.

    The affinity is changed only when every listed core is in the process's current mask (a
    container may hide some); otherwise only the thread count is set.
    """
    cores = parse_cpu_ids(cpu_ids)
    torch.set_num_threads(len(cores))
    bound = hasattr(os, "sched_setaffinity") and set(cores) <= os.sched_getaffinity(0)
    if bound:
        os.sched_setaffinity(0, cores)
    where = "bound to" if bound else "not bound (cores outside the allowed set):"
    return f"{len(cores)} torch threads, {where} cpus {','.join(map(str, cores))}"


register(
    "init_cpu_threads_env(str cpu_ids) -> str", init_cpu_threads_env, dispatch_key=NO_TENSOR_KEY
)
