"""Paired bootstrap intervals for run rates replayed on the same steps.

Two arms replayed on the same S steps give per-step tokens ``n_a, n_e`` and seconds ``t_a,
t_e``. A resample draws S step indices with replacement (the same indices for both arms, which
is what pairs them) and evaluates

    r_a = sum n_a / sum t_a,   r_e = sum n_e / sum t_e,   diff = r_a - r_e,   ratio = r_a / r_e

over the drawn steps; the 95% interval is the 2.5th-97.5th percentile of ``resamples`` draws
(seeded, so a replay is reproducible to the bit).

Steps are not independent: a policy carries state from step to step (its draft ledgers, its
mode chooser), and request streams (echo_lab.sim.rows) put the same requests in
consecutive steps. So the draws are *circular blocks* of ``L`` consecutive steps (a moving-block
bootstrap), ``L = block_length(S) = max(1, round(S ** (1/3)))`` (the usual S^(1/3) rate): 3 for
S = 20, 4 for S = 80.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class Paired:
    diff: float  # tokens/s of a minus tokens/s of e, on all steps
    diff_ci95: tuple[float, float]
    ratio: float
    ratio_ci95: tuple[float, float]


def block_length(steps: int) -> int:
    """``L = max(1, round(S ** (1/3)))``."""
    return max(1, round(math.pow(max(steps, 1), 1.0 / 3.0)))


def resample_index(steps: int, resamples: int, seed: int, block: int | None = None) -> Tensor:
    """[resamples, steps] int64 step indices: circular blocks of ``block`` consecutive steps
    (default :func:`block_length`) at uniform starts, with replacement, cut to ``steps``."""
    s = max(steps, 1)
    length = block_length(s) if block is None else max(1, min(block, s))
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, s, (resamples, -(-s // length)), generator=g)
    index = (starts.unsqueeze(-1) + torch.arange(length)).remainder(s)
    return index.reshape(resamples, -1)[:, :s]


def paired(
    tokens_a: Tensor, seconds_a: Tensor, tokens_e: Tensor, seconds_e: Tensor, index: Tensor
) -> Paired:
    """Paired difference and ratio of run rates with bootstrap 95% intervals (module docstring).

    All four series are [S] float64 over the same steps; ``index`` from :func:`resample_index`.
    """

    def rate(n: Tensor, t: Tensor) -> Tensor:
        return n.sum(-1) / t.sum(-1).clamp(min=1e-300)

    ra, re = rate(tokens_a, seconds_a), rate(tokens_e, seconds_e)
    ba, be = rate(tokens_a[index], seconds_a[index]), rate(tokens_e[index], seconds_e[index])
    d, r = ba - be, ba / be.clamp(min=1e-300)
    q = torch.tensor([0.025, 0.975], dtype=torch.float64)
    dq, rq = torch.quantile(d, q).tolist(), torch.quantile(r, q).tolist()
    return Paired(float(ra - re), (dq[0], dq[1]), float(ra / re) if re > 0 else 0.0, (rq[0], rq[1]))
