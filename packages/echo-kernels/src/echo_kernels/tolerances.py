"""How closely the Triton kernels and the torch references agree, per dtype.

Both backends accumulate in float32 and round the output once to the input dtype; the kernel
also rounds the softmax weights to the input dtype before the P @ V product (tensor cores),
and sums in another order. So the gap is about one output ulp: |x| <= 4 gives about 4e-3 in
float16 and 3e-2 in bfloat16 (8 mantissa bits), and float32 (IEEE dots, no TF32) agrees to
rounding. Compare with ``torch.testing.assert_close(kernel, reference, atol=t.atol,
rtol=t.rtol)``. Acceptance and commit kernels are exact: same integers as the references.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch


@dataclass(frozen=True, slots=True)
class Tolerance:
    """Absolute and relative tolerance of an elementwise comparison."""

    atol: float
    rtol: float


ATTENTION_TOLERANCES: Mapping[torch.dtype, Tolerance] = MappingProxyType(
    {
        torch.float32: Tolerance(atol=2e-5, rtol=2e-5),
        torch.float16: Tolerance(atol=2e-3, rtol=2e-3),
        torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
    }
)
"""Tree attention, Triton vs torch reference, per input dtype (measured margins: README)."""
