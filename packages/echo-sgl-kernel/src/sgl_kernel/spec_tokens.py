"""Token rewrites of SGLang's CPU speculative path: bonus tokens and draft input rotation.

Pure-torch versions of ``sgl_kernel.fill_bonus_tokens_cpu``
(``sglang/kernels/ops/speculative/eagle.py``) and ``sgl_kernel.rotate_input_ids_cpu``
(``sglang/kernels/ops/speculative/multi_layer_eagle.py``, the multi-layer EAGLE / MTP draft).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sgl_kernel.spec_checks import as_long, flat_view


def fill_bonus_tokens_cpu(
    accept_tokens: Tensor,  # [B, L] int32, accepted tokens of every request, bonus last
    accept_lens: Tensor,  # [B] int32, accepted tokens including the bonus (>= 1)
    bonus_tokens: Tensor,  # [B] int32, written
    accept_stride: int,  # L, the row width of accept_tokens
) -> None:
    """The last accepted token of every request:
    ``bonus_tokens[i] = accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]``.
    """
    lens = as_long(accept_lens, "accept_lens")
    b = lens.numel()
    out = flat_view(bonus_tokens, "bonus_tokens", b)
    if b == 0:
        return
    if bool((lens < 1).any()) or int(lens.max()) > accept_stride:
        raise ValueError(f"accept_lens must lie in [1, {accept_stride}], got {lens.tolist()}")
    tokens = accept_tokens.reshape(-1)
    out[:b] = tokens[accept_stride * torch.arange(b) + lens - 1].to(out.dtype)


def rotate_input_ids_cpu(
    input_ids: Tensor,  # [N] int64, packed extend tokens of all requests, rotated in place
    extend_start_loc: Tensor,  # [B] int, first token of every request's segment
    extend_seq_lens: Tensor,  # [B] int, segment lengths
    topk_index: Tensor,  # [B] int, the new token of every request
    select_index: Tensor | None = None,  # [B] int, where the new token goes; segment end if None
) -> None:
    """Shift every request's segment left by one and append its new token, in place.

    For request i with segment ``[s, s + n)``: ``ids[s : s + n - 1] = old ids[s + 1 : s + n]``,
    then, when n > 0, ``ids[select_index[i]] = topk_index[i]`` (default position s + n - 1).
    Segments are assumed disjoint, as the kernels assume.
    """
    ids = flat_view(input_ids, "input_ids")
    start = as_long(extend_start_loc, "extend_start_loc")
    length = as_long(extend_seq_lens, "extend_seq_lens")
    new = as_long(topk_index, "topk_index")
    b = length.numel()
    if start.numel() != b or new.numel() < b:
        raise ValueError(
            f"extend_start_loc ({start.numel()}) and topk_index ({new.numel()}) must cover "
            f"the {b} requests of extend_seq_lens"
        )
    shifted = (length - 1).clamp(min=0)
    owner = torch.repeat_interleave(torch.arange(b), shifted)
    offset = torch.arange(owner.numel()) - (torch.cumsum(shifted, 0) - shifted)[owner]
    dst = start[owner] + offset
    ids[dst] = ids[dst + 1]
    filled = length > 0
    if select_index is None:
        where = start + length - 1
    else:
        where = as_long(select_index, "select_index")[:b]
    ids[where[filled]] = new[:b][filled].to(ids.dtype)
