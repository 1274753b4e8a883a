"""Float tolerances from dtype and reduction size (the error model of echo_core.tolerance).

A value computed by a length-n reduction in floating point, with every stored intermediate
rounded to ``dtype`` and the sums accumulated in ``acc`` (float32 for 16-bit types, else the
dtype itself), is off by about ``scale * (eps(dtype) + eps(acc) * sqrt(n))``, where ``scale`` is
the magnitude of the reduced terms (Higham's statistical rule of thumb; echo_core.tolerance
derives it). The tests compare an op against a float64 reference, so only the op's side rounds.
"""

from __future__ import annotations

import torch

from echo_core.tolerance import SAFETY, float_tolerance

__all__ = ["SAFETY", "assert_close", "tolerance"]


def tolerance(dtype: torch.dtype, reduction: int, *, scale: float = 1.0) -> float:
    """atol = SAFETY * scale * (eps(dtype) + eps(acc) * sqrt(reduction)): echo-core's
    :func:`~echo_core.tolerance.float_tolerance` for one stage."""
    return float_tolerance(dtype, reduction, scale=scale)


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype,
    reduction: int,
    *,
    scale: float | None = None,
) -> None:
    """Compare ``actual`` with a float64 ``expected`` within :func:`tolerance`.

    ``scale`` defaults to max |expected| (the compared values bound the reduced terms for
    normalised outputs: norms, softmax averages, rotations).
    """
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    if scale is None:
        scale = float(expected.abs().max()) if expected.numel() else 0.0
    atol = tolerance(dtype, reduction, scale=scale)
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=0.0)
