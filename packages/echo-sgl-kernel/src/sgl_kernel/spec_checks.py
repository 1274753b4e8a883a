"""Argument checks shared by the speculative-decoding ops (spec_tree, spec_cache).

SGLang's CPU kernels write their results into tensors the caller allocated, so every output is
reached through a flat view of the caller's storage: a copy would silently drop the writes.
"""

from __future__ import annotations

import torch
from torch import Tensor

_INTEGER_DTYPES = frozenset(
    {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32}
)


def flat_view(tensor: Tensor, name: str, min_numel: int = 0) -> Tensor:
    """``tensor`` as a 1-D view of the same storage, holding at least ``min_numel`` elements.

    Raises ValueError when ``tensor`` is not contiguous (a flat view would have to copy, and
    writes into the copy would be lost) or is shorter than ``min_numel``.
    """
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {tensor.stride()}")
    if tensor.numel() < min_numel:
        raise ValueError(f"{name} needs at least {min_numel} elements, got {tensor.numel()}")
    return tensor.view(-1)


def require_integer(tensor: Tensor, name: str) -> None:
    """Raise ValueError unless ``tensor`` holds integers (indices, tokens, lengths)."""
    if tensor.dtype not in _INTEGER_DTYPES:
        raise ValueError(f"{name} must hold integers, got {tensor.dtype}")


def require_shape(tensor: Tensor, name: str, shape: tuple[int, ...]) -> None:
    """Raise ValueError unless ``tensor`` has exactly ``shape``."""
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")


def as_long(tensor: Tensor, name: str) -> Tensor:
    """The integer ``tensor`` flattened to int64 (a read-only input; a copy is fine)."""
    require_integer(tensor, name)
    return tensor.reshape(-1).to(torch.int64)
