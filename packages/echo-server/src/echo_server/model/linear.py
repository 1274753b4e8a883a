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

Padding few rows. A packed call's cost is not monotone in its rows: on the AMD EPYC VM (one
thread, SmolLM2-135M, every layer's projection swept per row count so its weight streams from
memory as in a forward; a one-off script, bench_row_staircase.py at 87d8d57, 2026-12-04) the whole
model's projections cost 37.6 / 45.8 / 32.2 / 30.3 / 29.9 / 29.5 / 37.4 / 39.6 ms for 1-8 rows:
oneDNN
streams the weight most efficiently for 4-6 rows, and 1 / 2 / 3 rows cost 24 / 51 / 6% more
than 4. So a call of m rows may run as ``pad_to[m - 1] > m``
rows, zero rows appended and their outputs dropped: a one-row decode step then costs what four
rows do, a two-row one a third less. :func:`row_paths` measures the table at load
(``ECHO_LINEAR_PAD=auto``, the default; ``off`` never pads): for every m up to
:data:`MAX_PADDED_ROWS` the row count ``m' >= m`` of least median time, kept only when it saves
at least :data:`PAD_MARGIN` of m's time (ties and noise stay unpadded: at 5% one load padded
4 rows to 6 for a call 5% dearer). Numerics: from two rows on each
row's result does not depend on the other rows (bitwise, see above), so padding 2-3 rows changes
no output bit; a padded single row takes the multi-row path, the one every verify pass takes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

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
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    # oneDNN packs bfloat16 only where the CPU has AVX512-BW/VL/DQ or AVX-NE-CONVERT; elsewhere
    # (an AVX2-only AMD EPYC, say) the reorder raises, so ask oneDNN first.
    return weight.dtype != torch.bfloat16 or bool(ops._is_mkldnn_bf16_supported())


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
        self.in_features = weight.shape[1]
        self.dtype = weight.dtype
        self.packed: Tensor | None = None
        self.plain_single_row = False  # 1-row calls use F.linear (module docstring)
        self.pad_to: tuple[int, ...] = ()  # pad_to[m - 1]: rows a packed m-row call runs as
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
        rows = x.reshape(-1, x.shape[-1])
        m = rows.shape[0]
        target = self.pad_to[m - 1] if m <= len(self.pad_to) else m
        if target > m:  # cheaper as more rows (module docstring: padding few rows)
            rows = torch.cat([rows, rows.new_zeros(target - m, rows.shape[1])])
        out: Tensor = torch.ops.mkldnn._linear_pointwise(
            rows.contiguous(), self.packed, self.bias, "none", [], ""
        )
        return out[:m].reshape(*x.shape[:-1], out.shape[-1])


SINGLE_ROW_MODES = ("auto", "plain", "packed")
PAD_MODES = ("auto", "off")
REPEATS = 5  # timed rounds per candidate path (order rotated); the medians decide
MAX_PADDED_ROWS = 8
"""Row counts :func:`row_paths` times for padding: calls of up to this many rows may be padded."""
PAD_MARGIN = 0.10
"""Least saving (fraction of an m-row call's time) for which a call of m rows is padded."""
PAD_TIE = 0.02
"""Row counts within this fraction of the least time tie; the fewest rows among them win."""


@dataclass(frozen=True, slots=True)
class RowPaths:
    """How a group of :class:`Linear` runs few rows (module docstring): 1-row calls on the
    plain weight, and the padded row count ``pad_to[m - 1]`` of an m-row packed call (``()``:
    never padded)."""

    plain_single_row: bool
    pad_to: tuple[int, ...] = ()

    def apply(self, linears: Linear | Sequence[Linear]) -> None:
        """Set both on every Linear of the group."""
        for lin in [linears] if isinstance(linears, Linear) else linears:
            lin.plain_single_row = self.plain_single_row
            lin.pad_to = self.pad_to


def row_paths(
    linears: Linear | Sequence[Linear], mode: str | None = None, pad: str | None = None
) -> RowPaths:
    """The :class:`RowPaths` of ``linears`` (every layer's projection of one name, or one
    Linear), timed on this machine.

    ``mode`` (default ``ECHO_LINEAR_SINGLE_ROW``, else ``auto``): ``plain`` / ``packed`` force
    the 1-row path, ``auto`` takes the faster; ``pad`` (default ``ECHO_LINEAR_PAD``, else
    ``auto``): ``off`` never pads. Timing: one row through every given Linear's plain weight and
    m rows through every packed one for m = 1..:data:`MAX_PADDED_ROWS` (1 only without padding),
    each a sweep over the whole group, in :data:`REPEATS` rounds with the order rotated, after a
    warm-up; with ``p(m)`` the median of the packed m-row sweeps,

        m* = min{m' >= m : p(m') <= (1 + PAD_TIE) min_{k >= m} p(k)}
        pad_to[m - 1] = m*   if p(m*) < (1 - PAD_MARGIN) p(m), else m

    and 1-row calls go plain when the plain sweep beats ``p(pad_to[0])``.

    Sweeping all layers matters: a forward streams each layer's weight from memory once, while
    one weight timed in a loop stays in cache, where packing can win. Timing the first layer's
    weight alone picked the packed qkv in one process and the plain one in the next on the dev
    CPU (AMD EPYC, one thread), although over all 30 layers one row costs 8.7-9.3 ms plain and
    10.8-11.8 ms packed. Real ties stay ties (gate_up: 34-38 ms either way), where either answer
    costs the same."""
    group = [linears] if isinstance(linears, Linear) else list(linears)
    mode = mode or os.environ.get("ECHO_LINEAR_SINGLE_ROW", "auto")
    pad = pad or os.environ.get("ECHO_LINEAR_PAD", "auto")
    if mode not in SINGLE_ROW_MODES:
        raise ValueError(f"ECHO_LINEAR_SINGLE_ROW must be one of {SINGLE_ROW_MODES}, got {mode!r}")
    if pad not in PAD_MODES:
        raise ValueError(f"ECHO_LINEAR_PAD must be one of {PAD_MODES}, got {pad!r}")
    if not group or any(lin.packed is None for lin in group):
        return RowPaths(False)  # nothing packed: F.linear serves every call
    plain_left = all(lin.weight is not None for lin in group)
    if mode != "auto" and pad == "off":
        return RowPaths(mode == "plain" and plain_left)
    width, dtype = group[0].in_features, group[0].dtype  # packed: a CPU weight
    sizes = range(1, (MAX_PADDED_ROWS if pad == "auto" else 1) + 1)
    sweeps: dict[str, Callable[[], None]] = {}
    for m in sizes:
        x = torch.zeros(m, width, dtype=dtype)
        sweeps[f"packed{m}"] = sweep(group, x, packed=True)
    if mode == "auto" and plain_left:
        sweeps["plain"] = sweep(group, torch.zeros(1, width, dtype=dtype), packed=False)
    median = rotating_medians(sweeps)
    packed = [median[f"packed{m}"] for m in sizes]
    pad_to = []
    for m in sizes:
        low = min(packed[m - 1 :])
        best = next(k for k in range(m, len(packed) + 1) if packed[k - 1] <= (1 + PAD_TIE) * low)
        pad_to.append(best if packed[best - 1] < (1 - PAD_MARGIN) * packed[m - 1] else m)
    while pad_to and pad_to[-1] == len(pad_to):
        pad_to.pop()  # trailing identities: nothing to pad
    table = tuple(pad_to)
    if mode != "auto":
        return RowPaths(mode == "plain" and plain_left, table)
    one = packed[(table[0] if table else 1) - 1]
    return RowPaths(plain_left and median.get("plain", float("inf")) < one, table)


def single_row_path(linears: Linear | Sequence[Linear], mode: str | None = None) -> bool:
    """Whether 1-row calls of ``linears`` should use the plain weight (:func:`row_paths`
    without padding)."""
    return row_paths(linears, mode, pad="off").plain_single_row


def sweep(group: Sequence[Linear], x: Tensor, packed: bool) -> Callable[[], None]:
    """One call of ``x`` through every Linear of ``group``, on the packed weight (never padded) or
    on the plain one."""

    def run() -> None:
        for lin in group:
            if packed:
                torch.ops.mkldnn._linear_pointwise(x, lin.packed, lin.bias, "none", [], "")
            else:
                assert lin.weight is not None
                F.linear(x, lin.weight, lin.bias)

    return run


K = TypeVar("K", bound=Hashable)


def rotating_medians(
    calls: Mapping[K, Callable[[], None]], rounds: int = REPEATS
) -> dict[K, float]:
    """Median wall seconds of each call over ``rounds`` rounds, each round timing every call once
    with the order rotated by one, after one warm-up call of each (the upper median for an even
    ``rounds``)."""
    names = list(calls)
    for name in names:
        calls[name]()
    times: dict[K, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[rounds // 2] for name, t in times.items()}
