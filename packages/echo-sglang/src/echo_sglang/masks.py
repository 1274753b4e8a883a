"""SGLang's verify attention masks, from per-row visibility of a request's verify rows.

SGLang's attention backends take the tree mask in one of three encodings (``TreeMaskMode`` in
``sglang.kernels.ops.speculative.spec_tree``; the values below are the same integers):

- ``FULL_MASK``: per request ``b`` with ``p_b`` cached tokens and ``q_b`` verify rows, a row-major
  ``[q_b, p_b + q_b]`` bool block (columns: the cached prefix, then the verify rows), blocks
  concatenated over the batch; block ``b`` starts at ``mask_indptr[b] = sum_{c<b} q_c (p_c +
  q_c)``. This is the ``custom_mask``/``mask_indptr`` pair of FlashInfer's custom-mask prefill and
  of SGLang's Triton ``extend_attention_fwd``. SGLang's EAGLE fills the prefix columns with True;
  so do we, padding rows included (the Triton backend ignores prefix columns anyway).
- ``QLEN_ONLY``: only the ``[q, q]`` blocks, flattened (fixed ``q = T``).
- ``QLEN_ONLY_BITPACKING``: one integer per row, bit ``j`` set iff verify row ``j`` is visible;
  uint8 for ``T <= 8``, uint16 for ``T <= 16``, uint32 for ``T <= 32``.

SGLang preallocates the buffer the mask is written into (``VerifyMask`` in
``layers/attention/verify_mask.py``): bool for most backends, uint8 for the Triton backend (which
reads it as 0/1 bytes). :func:`write_mask` writes the bool encodings in either dtype; the packed
words only in their own dtype, since a cast would change their bits.
"""

from __future__ import annotations

import enum

import torch
from torch import Tensor


class TreeMaskMode(enum.IntEnum):
    """SGLang's tree-mask encodings (module docstring), same integer values."""

    FULL_MASK = 0
    QLEN_ONLY = 1
    QLEN_ONLY_BITPACKING = 2


BITPACK_DTYPES = ((8, torch.uint8), (16, torch.uint16), (32, torch.uint32))
"""Widest verify width each packed dtype holds, as SGLang picks them."""

BOOL_BUFFER_DTYPES = (torch.bool, torch.uint8)
"""Buffer dtypes a bool mask (FULL_MASK, QLEN_ONLY) is written in: True -> 1, False -> 0."""


def full_mask(
    visible: Tensor,  # [R, W] bool, row r sees local verify row c of its request (c < q_b)
    cu_rows: Tensor,  # [B+1] int64, request b owns rows cu_rows[b]:cu_rows[b+1] (q_b rows)
    prefix_len: Tensor,  # [B] int64, cached tokens p_b
) -> tuple[Tensor, Tensor]:
    """``(custom_mask [sum q_b (p_b + q_b)] bool, mask_indptr [B+1] int64)``, FULL_MASK layout."""
    dev = visible.device
    b = prefix_len.numel()
    q = cu_rows[1:] - cu_rows[:-1]
    row_len = prefix_len.to(torch.int64) + q  # [B]
    indptr = torch.zeros(b + 1, dtype=torch.int64, device=dev)
    indptr[1:] = torch.cumsum(q * row_len, 0)
    r = visible.shape[0]
    if r != int(cu_rows[-1]):
        raise ValueError(f"visible has {r} rows but cu_rows ends at {int(cu_rows[-1])}")
    mask = torch.zeros(int(indptr[-1]), dtype=torch.bool, device=dev)
    if r == 0:
        return mask, indptr
    req = torch.repeat_interleave(torch.arange(b, device=dev), q)  # [R]
    local = torch.arange(r, device=dev) - cu_rows[:-1][req]
    row_start = indptr[:-1][req] + local * row_len[req]  # [R]
    pref = prefix_len.to(torch.int64)[req]  # [R]
    # Prefix columns 0..p_b-1 of every row: one entry per (row, column), column = rank in row.
    first = torch.repeat_interleave(torch.cumsum(pref, 0) - pref, pref)
    column = torch.arange(first.numel(), device=dev) - first
    mask[torch.repeat_interleave(row_start, pref) + column] = True
    rows, cols = visible.nonzero(as_tuple=True)
    if bool((cols >= q[req[rows]]).any()):
        raise ValueError("visible marks a column beyond its request's verify rows")
    mask[row_start[rows] + pref[rows] + cols] = True
    return mask, indptr


def qlen_only_mask(tree_mask: Tensor) -> Tensor:
    """[B, T, T] bool -> [B * T * T] bool (QLEN_ONLY)."""
    return tree_mask.reshape(-1).contiguous()


def bitpacked_mask(tree_mask: Tensor) -> Tensor:
    """[B, T, T] bool -> [B * T] uint8/16/32 (QLEN_ONLY_BITPACKING); T <= 32."""
    t = tree_mask.shape[-1]
    dtype = next((d for width, d in BITPACK_DTYPES if t <= width), None)
    if dtype is None:
        raise ValueError(f"bit-packed masks hold at most 32 verify rows, got T={t}")
    weights = torch.ones(t, dtype=torch.int64, device=tree_mask.device) << torch.arange(
        t, device=tree_mask.device
    )
    packed = (tree_mask.reshape(-1, t).to(torch.int64) * weights).sum(-1)
    return packed.to(dtype)


def encode_mask(mode: TreeMaskMode | int, tree_mask: Tensor, prefix_len: Tensor) -> Tensor:
    """Padded ``tree_mask`` [B, T, T] in SGLang's ``mode`` (FULL_MASK adds the prefix columns)."""
    mode = TreeMaskMode(int(mode))
    if mode is TreeMaskMode.QLEN_ONLY:
        return qlen_only_mask(tree_mask)
    if mode is TreeMaskMode.QLEN_ONLY_BITPACKING:
        return bitpacked_mask(tree_mask)
    b, t, _ = tree_mask.shape
    cu = torch.arange(b + 1, device=tree_mask.device, dtype=torch.int64) * t
    return full_mask(tree_mask.reshape(b * t, t), cu, prefix_len)[0]


def write_mask(
    buffer: Tensor,  # [M] bool or uint8 (bool modes), or the packed dtype; M >= mask.numel()
    mask: Tensor,  # [m] bool, or [B * T] uint8/16/32 (QLEN_ONLY_BITPACKING)
) -> None:
    """``buffer[:m] = mask`` in the buffer's dtype: bool masks as bool or 0/1 uint8, packed masks
    only into their own dtype; any other dtype, or a buffer shorter than the mask, raises."""
    allowed = BOOL_BUFFER_DTYPES if mask.dtype == torch.bool else (mask.dtype,)
    if buffer.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise ValueError(
            f"custom_mask buffer is {buffer.dtype}; a {mask.dtype} mask is written as {names}"
        )
    flat = buffer.view(-1)
    if flat.numel() < mask.numel():
        raise ValueError(
            f"custom_mask buffer holds {flat.numel()} entries, the mask needs {mask.numel()}"
        )
    flat[: mask.numel()].copy_(mask)
