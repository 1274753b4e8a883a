"""Float tolerances derived from dtype and reduction size, for comparing two computations.

Two computations of the same quantity that differ only in rounding (another summation order,
fused vs separate projections, a ragged batch vs one request, oneDNN choosing other kernels on
another CPU) agree to within their rounding errors. :func:`float_tolerance` turns a rounding-error
model into an absolute tolerance, so a test states what it reduces over (hidden size, layers)
instead of a constant measured on one machine.

Error model. A length-n dot product ``s = sum x_i y_i`` evaluated in floating point with unit
roundoff ``u = eps / 2`` obeys ``|fl(s) - s| <= gamma_n sum |x_i y_i|``, ``gamma_n = n u / (1 -
n u)`` (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Thm 3.1): linear in
n in the worst case. That bound needs every rounding to err the same way; with the roundings
modelled as independent zero-mean errors (Higham sec. 2.8 "rule of thumb") the error has
standard deviation about ``sqrt(n) u`` times the magnitude of the terms. We use the statistical
``sqrt(n)`` model: the worst-case bound is too loose to fail (SmolLM2-135M, n = 1536 over 30
layers, |logit| <= 37: about 0.1 on logits, which a KV cache rounded to float16 would pass).

Formula::

    atol = SAFETY * scale * sqrt(depth) * (eps(dtype) + eps(acc) * sqrt(reduction))

- ``eps(dtype)`` is ``torch.finfo(dtype).eps`` (1.2e-7 float32, 9.8e-4 float16, 7.8e-3
  bfloat16): every stored intermediate is rounded once to ``dtype``;
- ``acc`` is the accumulation dtype of the reductions: float32 for float16 / bfloat16 (torch's
  CPU and CUDA matmuls accumulate half types in float32), else ``dtype`` itself. So float32 and
  float64 give ``eps * (1 + sqrt(n))``, and half types are dominated by the storage rounding;
- ``reduction`` (n): the longest dot product feeding a compared value (a model's
  ``max(hidden_size, intermediate_size)``, a linear layer's ``in_features``, attention's
  ``max(head_dim, context)``);
- ``depth``: sequential stages whose errors compound (a model's decoder layers). Independent
  stage errors add in quadrature, hence ``sqrt(depth)``; this assumes the stages do not amplify
  perturbations, which residual streams with RMS norms roughly satisfy (measured: the
  30-layer SmolLM2 stays below 0.2 of ``atol / SAFETY``, like 2-layer models);
- ``scale``: magnitude of the compared values (stands in for ``sum |x_i y_i|``); pass the
  reference's largest absolute value (``max |logit|``), or 1 for values of order one;
- ``SAFETY = 4``: two implementations each round, so their difference has ``sqrt(2)`` times the
  standard deviation ``u sqrt(n)`` of one; the largest of ~1e6 compared elements (rows x vocab)
  lies within about 5 standard deviations: ``5 * sqrt(2) * u = 3.5 eps``, rounded up to 4.

A comparison with a float64 reference (brute force) has one rounded side only; the same
tolerance then holds with room to spare. Exactness contracts (greedy tokens, integer results)
are compared exactly, never with this.
"""

from __future__ import annotations

import math

import torch

SAFETY = 4.0
"""Multiple of the error model's unit ``eps * sqrt(n)`` (the module docstring derives it)."""

_HALF_TYPES = (torch.float16, torch.bfloat16)


def float_tolerance(
    dtype: torch.dtype, reduction: int, depth: int = 1, *, scale: float = 1.0
) -> float:
    """Absolute tolerance between two ``dtype`` computations that differ only in rounding.

    ``atol = SAFETY * scale * sqrt(depth) * (eps(dtype) + eps(acc) * sqrt(reduction))``, with
    ``acc`` float32 for half types and ``dtype`` otherwise (see the module docstring). Example:
    float32, ``reduction=1536``, ``depth=30``, ``scale=36.8`` (SmolLM2-135M's logits) gives
    3.9e-3; chunked vs one prefill differ by 1.2e-4, a float16-rounded KV cache by 1.1e-2.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"float_tolerance needs a floating dtype, got {dtype}")
    if reduction < 1 or depth < 1:
        raise ValueError(f"reduction and depth must be >= 1, got {reduction} and {depth}")
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"scale must be finite and >= 0, got {scale}")
    acc = torch.float32 if dtype in _HALF_TYPES else dtype
    unit = torch.finfo(dtype).eps + torch.finfo(acc).eps * math.sqrt(reduction)
    return SAFETY * scale * math.sqrt(depth) * unit
