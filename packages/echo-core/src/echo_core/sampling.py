"""Sampling parameters and the target distribution they define.

Per request, the target distribution over the vocabulary at one verify row is obtained from the
model's logits ``z`` (``[V]``) in this order:

1. temperature: ``z' = z / T``; ``T = 0`` means greedy: ``p = onehot(argmax z)`` (first index on
   ties) and the steps below are skipped;
2. top-k (``k > 0``): keep the ``k`` largest ``z'`` (ties broken by lower token id), set the
   rest to ``-inf``; ``pi = softmax(z')``;
3. top-p (``0 < top_p <= 1``): sort ``pi`` descending as ``pi_(1) >= pi_(2) >= ...`` and keep
   rank ``r`` iff ``sum_{j<r} pi_(j) < top_p``, i.e. the smallest prefix whose mass reaches
   ``top_p`` (rank 1 always kept; ``top_p = 1`` keeps everything);
4. renormalise: ``p = pi * keep / sum(pi * keep)``.

Worked example: ``z = log([0.5, 0.3, 0.2])``, ``T = 1``, ``k = 0``, ``top_p = 0.6``: the
exclusive prefix masses are ``0, 0.5, 0.8``, ranks 1-2 are kept, ``p = [0.625, 0.375, 0]``.

:func:`target_probs` applies this to a batch of rows with per-row parameters, without a Python
loop over rows; :class:`SamplingParams` holds and validates one request's parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.errors import SamplingParamsError

GREEDY_TEMPERATURE = 0.0
"""Temperature that selects greedy decoding."""

TOP_K_OFF = 0
"""``top_k`` value that disables top-k filtering."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """One request's decoding parameters; invalid values raise :class:`SamplingParamsError`."""

    temperature: float = 1.0
    top_k: int = TOP_K_OFF
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        t = self.temperature
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise SamplingParamsError(f"temperature must be a finite number >= 0, got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise SamplingParamsError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if not _is_real(p) or not math.isfinite(p) or not 0 < p <= 1:
            raise SamplingParamsError(f"top_p must be in (0, 1], got {p!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise SamplingParamsError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise SamplingParamsError(f"seed must be an int or None, got {self.seed!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise SamplingParamsError(
                f"stop must be a tuple of non-empty strings, got {self.stop!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise SamplingParamsError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    @property
    def is_greedy(self) -> bool:
        """True when ``temperature == 0``: the target distribution is one-hot at the argmax."""
        return self.temperature == GREEDY_TEMPERATURE


def stack_sampling_params(
    params: Sequence[SamplingParams], device: torch.device | str = "cpu"
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-request ``(temperature [R] float32, top_k [R] int64, top_p [R] float32)`` tensors."""
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
    # A valid top_p below float32's range rounds to 0; the smallest normal float32 keeps the same
    # meaning (only the top token survives).
    top_p = top_p.clamp(min=torch.finfo(torch.float32).tiny)
    return temperature, top_k, top_p


def _check_inputs(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor) -> None:
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise SamplingParamsError(
            f"logits must be a [R, V] float tensor, got {tuple(logits.shape)} {logits.dtype}"
        )
    r = logits.shape[0]
    for name, t, floating in (
        ("temperature", temperature, True),
        ("top_k", top_k, False),
        ("top_p", top_p, True),
    ):
        if t.shape != (r,):
            raise SamplingParamsError(f"{name} must have shape [{r}], got {tuple(t.shape)}")
        if t.device != logits.device:
            raise SamplingParamsError(f"{name} is on {t.device}, logits on {logits.device}")
        if floating != t.dtype.is_floating_point:
            raise SamplingParamsError(f"{name} has dtype {t.dtype}")
    if top_k.dtype != torch.int64:
        raise SamplingParamsError(f"top_k must be int64, got {top_k.dtype}")
    if r == 0:
        return
    if not bool((temperature >= 0).all()):  # False for NaN as well
        raise SamplingParamsError(f"temperature must be >= 0, got {temperature.tolist()}")
    if bool((top_k < 0).any()):
        raise SamplingParamsError(f"top_k must be >= 0, got {top_k.tolist()}")
    if not bool(((top_p > 0) & (top_p <= 1)).all()):
        raise SamplingParamsError(f"top_p must be in (0, 1], got {top_p.tolist()}")


def target_probs(
    logits: Tensor,  # [R, V] float (any floating dtype)
    temperature: Tensor,  # [R] float, >= 0, 0 = greedy
    top_k: Tensor,  # [R] int64, >= 0, 0 = off
    top_p: Tensor,  # [R] float, in (0, 1]
) -> Tensor:  # [R, V] float32, rows sum to 1
    """The target distribution of every row: temperature, then top-k, then top-p, renormalised.

    See the module docstring for the exact rule. Greedy rows (``temperature == 0``) are one-hot
    at ``argmax(logits)``.
    """
    _check_inputs(logits, temperature, top_k, top_p)
    rows, vocab = logits.shape
    z = logits.to(torch.float32)
    greedy = temperature == GREEDY_TEMPERATURE  # [R] bool
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature).to(torch.float32)
    # Shift by the row max first: a tiny temperature then sends non-max logits to -inf instead of
    # overflowing the max to +inf (inf - inf = NaN in the softmax).
    z = (z - z.max(dim=-1, keepdim=True).values) / safe_t[:, None]
    # Stable sort: equal logits keep token-id order, so top_k = 1 agrees with argmax.
    sorted_z, order = torch.sort(z, dim=-1, descending=True, stable=True)  # [R, V]
    rank = torch.arange(vocab, device=z.device)  # [V]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))  # [R]
    sorted_z = sorted_z.masked_fill(rank[None, :] >= k[:, None], float("-inf"))
    pi = torch.softmax(sorted_z, dim=-1)  # [R, V] float32, descending
    mass_before = torch.cumsum(pi, dim=-1) - pi  # exclusive prefix mass
    keep = (mass_before < top_p.to(torch.float32)[:, None]) | (top_p >= 1)[:, None]
    keep[:, 0] = True
    kept = pi * keep
    kept = kept / kept.sum(dim=-1, keepdim=True)
    probs = torch.zeros_like(kept).scatter_(1, order, kept)
    if rows and bool(greedy.any()):
        one_hot = torch.zeros_like(probs)
        one_hot.scatter_(1, torch.argmax(logits, dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs
