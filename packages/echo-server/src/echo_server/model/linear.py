"""Dense projections ``y = x W^T + b``, with the weight prepacked for oneDNN on the CPU.

Why: on a CPU, ``F.linear`` with a handful of rows runs a GEMM that re-packs the whole weight on
every call, so verifying 2-8 rows costs 1.5-2x a 1-row decode step although both are bound by
reading the weights once. oneDNN's linear over a weight reordered once at load time
(``mkldnn::_reorder_linear_weight`` + ``mkldnn::_linear_pointwise``, the ops PyTorch's own
inductor CPU backend emits) costs about the same for 1 to 8 rows and is faster even for one
(measured on the dev CPU with one thread, SmolLM2-135M shapes: lm_head 576 -> 49,152 at 1 / 4 / 16
rows: 7.3 / 13.2 / 17.1 ms with ``F.linear``, 3.7 / 3.6 / 6.5 ms packed). That is what makes a
verify pass nearly free for the first few draft rows, the regime speculative decoding needs.

Numerics: float32 results differ from ``F.linear`` by rounding only (about 1e-6 relative); for
2 or more rows each row's result does not depend on the other rows (bitwise), the 1-row call
takes a separate path, exactly like ``F.linear``'s GEMV/GEMM split.

Used for float32 weights on the CPU when the ops exist (PyTorch built with oneDNN, as the
official CPU wheels are); everything else keeps ``F.linear``. ``ECHO_PACKED_LINEAR=0`` turns it
off. A model keeps one copy: :class:`~echo_server.model.llama.LlamaModel` releases the plain
copy of each packed layer projection (:meth:`Linear.release_plain`); the lm_head keeps both, since
its plain tensor is also the (tied) embedding and the draft head's output layer.

Single rows. Whether packing pays for one row depends on the CPU: on the AMD EPYC VM (one
thread, SmolLM2 shapes, 2026-12-01) ``F.linear``'s GEMV took 0.44-0.66x the packed time for the
layer projections and 0.92x for the lm_head at one row, while packing won 1.2-2.3x from two
rows on (o_proj from six); the whole 1-row forward took 88 ms with ``F.linear`` and 107 ms
packed. Plain decoding runs one row per request per step, so a packed-only model handicaps it.
:func:`single_row_path` decides per projection name, once per model load
(``ECHO_LINEAR_SINGLE_ROW=auto``, the default: the faster of the two on timed 1-row sweeps over
every layer's weight;
``plain`` / ``packed`` force it); a :class:`Linear` whose single-row path is plain keeps its plain
copy and uses it for 1-row calls only. The 1-row call was already a path of its own (GEMV), so
this adds no new kind of rounding difference between a decode step and a verify pass.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def packing_available(weight: Tensor, allow_bf16: bool = False) -> bool:
    """Whether :class:`Linear` will prepack ``weight`` (float32, or bfloat16 when
    ``allow_bf16``; CPU; oneDNN ops present). The target model packs float32 only; the draft
    head opts into bfloat16 (drafting/eagle_drafter.py: its dtype never touches the output)."""
    if os.environ.get("ECHO_PACKED_LINEAR", "1") == "0":
        return False
    dtypes = (torch.float32, torch.bfloat16) if allow_bf16 else (torch.float32,)
    if weight.device.type != "cpu" or weight.dtype not in dtypes or weight.dim() != 2:
        return False
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


class Linear:
    """``y = x W^T + b`` for ``x`` [..., in]: oneDNN-packed when available, else ``F.linear``."""

    def __init__(
        self, weight: Tensor, bias: Tensor | None = None, allow_bf16: bool = False
    ) -> None:
        """``allow_bf16``: pack a bfloat16 ``weight`` too (:func:`packing_available`); inputs
        must then be bfloat16."""
        self.weight: Tensor | None = weight  # [out, in]; None once released (packed only)
        self.bias = bias
        self.out_features = weight.shape[0]
        self.packed: Tensor | None = None
        self.plain_single_row = False  # 1-row calls use F.linear (module docstring)
        if packing_available(weight, allow_bf16):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)

    def release_plain(self) -> bool:
        """Drop the plain weight when a packed copy serves every call (one copy in memory);
        False when nothing was packed or single rows use the plain weight."""
        if self.packed is None or self.plain_single_row:
            return False
        self.weight = None
        return True

    def __call__(self, x: Tensor) -> Tensor:
        if x.numel() == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features)
        if self.packed is None or (self.plain_single_row and x.numel() == x.shape[-1]):
            assert self.weight is not None  # released only when packed
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out: Tensor = torch.ops.mkldnn._linear_pointwise(
            rows, self.packed, self.bias, "none", [], ""
        )
        return out.reshape(*x.shape[:-1], out.shape[-1])


SINGLE_ROW_MODES = ("auto", "plain", "packed")
REPEATS = 5  # alternating timed sweeps per path; the medians decide


def single_row_path(linears: Linear | Sequence[Linear], mode: str | None = None) -> bool:
    """Whether 1-row calls of ``linears`` (every layer's projection of one name, or one Linear)
    should use the plain weight: ``mode`` (default ``ECHO_LINEAR_SINGLE_ROW``, else ``auto``)
    ``plain`` / ``packed`` force it; ``auto`` times one row through every given Linear in turn,
    both ways in alternating sweeps (median of ``REPEATS`` sweeps each), and takes the faster.

    Sweeping all layers matters: a forward streams each layer's weight from memory once, while
    one weight timed in a loop stays in cache, where packing can win. Timing the first layer's
    weight alone picked the packed qkv in one process and the plain one in the next on the dev
    CPU (AMD EPYC, one thread), although over all 30 layers one row costs 8.7-9.3 ms plain and
    10.8-11.8 ms packed. Real ties stay ties (gate_up: 34-38 ms either way), where either answer
    costs the same."""
    group = [linears] if isinstance(linears, Linear) else list(linears)
    mode = mode or os.environ.get("ECHO_LINEAR_SINGLE_ROW", "auto")
    if mode not in SINGLE_ROW_MODES:
        raise ValueError(f"ECHO_LINEAR_SINGLE_ROW must be one of {SINGLE_ROW_MODES}, got {mode!r}")
    pairs: list[tuple[Tensor, Tensor, Tensor | None]] = []
    for lin in group:
        if lin.weight is None or lin.packed is None:
            return False  # nothing to choose: one path is gone
        pairs.append((lin.weight, lin.packed, lin.bias))
    if not pairs:
        return False
    if mode != "auto":
        return mode == "plain"
    first = pairs[0][0]
    x = torch.zeros(1, first.shape[1], dtype=first.dtype, device=first.device)

    def plain() -> None:
        for weight, _, bias in pairs:
            F.linear(x, weight, bias)

    def onednn() -> None:
        for _, packed, bias in pairs:
            torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    plain_s, packed_s = _alternating_medians(plain, onednn)
    return plain_s < packed_s


def _alternating_medians(a: Callable[[], None], b: Callable[[], None]) -> tuple[float, float]:
    """Median wall time of ``a`` and of ``b`` over ``REPEATS`` rounds, each round timing both
    (order alternating), after one warm-up call of each."""
    a()
    b()
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(REPEATS):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            start = time.perf_counter()
            (a, b)[i]()
            times[i].append(time.perf_counter() - start)
    return sorted(times[0])[REPEATS // 2], sorted(times[1])[REPEATS // 2]
