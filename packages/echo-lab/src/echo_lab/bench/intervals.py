"""Speed ratios measured on a noisy machine: paired, interleaved, with an interval.

Two arms (a reference and a candidate) run the same items (prompts) in interleaved rounds, so
slow drift of the machine lands on both. With ``ref[r][i]`` and ``cand[r][i]`` the seconds of
item ``i`` in round ``r``:

- a round's ratio is ``sum_i ref[r][i] / sum_i cand[r][i]`` (a speedup: > 1 means the candidate
  is faster), and the reported ``ratio`` is the median over rounds;
- ``ci95`` is a paired percentile bootstrap over items: resample items with replacement (the
  same items for both arms and every round), recompute ``sum ref / sum cand`` over all rounds,
  and take the 2.5th and 97.5th percentiles of ``resamples`` such ratios (seeded, so the same
  timings give the same interval);
- ``spread`` is ``(min, max)`` of the round ratios.

Where items cannot be timed apart (a closed loop at concurrency > 1 overlaps its requests), each
round is one replicate: :func:`round_ratio` reports the median of the per-round ratios and a
Student-t 95% interval of their log, ``exp(mean(log r) +- t_{0.975, n-1} * sd(log r) / sqrt(n))``
(the ratio of two noisy timings is closer to log-normal than normal).
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class PairedRatio:
    """The speedup of a candidate over a reference (module docstring)."""

    ratio: float  # median of the round ratios
    ci95: tuple[float, float]  # paired bootstrap over items
    spread: tuple[float, float]  # min and max round ratio
    rounds: tuple[float, ...]  # every round's ratio

    def describe(self) -> str:
        lo, hi = self.ci95
        return (
            f"{self.ratio:.2f}x (95% CI {lo:.2f}-{hi:.2f}, rounds "
            + " ".join(f"{r:.2f}" for r in self.rounds)
            + ")"
        )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100): linear interpolation between the sorted values at rank
    ``(n - 1) q / 100``; NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    rank = (len(s) - 1) * q / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def paired_ratio(
    reference: Sequence[Sequence[float]],
    candidate: Sequence[Sequence[float]],
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> PairedRatio:
    """``reference[r][i]`` / ``candidate[r][i]``: seconds of item i in round r (same shape)."""
    ref = torch.tensor(reference, dtype=torch.float64)
    cand = torch.tensor(candidate, dtype=torch.float64)
    if ref.dim() != 2 or ref.shape != cand.shape or ref.numel() == 0:
        raise ValueError(
            f"need two equal [rounds, items] tables, got {tuple(ref.shape)} and {tuple(cand.shape)}"
        )
    if bool((ref <= 0).any() | (cand <= 0).any()):
        raise ValueError("every timing must be > 0 seconds")
    per_round = ref.sum(1) / cand.sum(1)
    items = ref.shape[1]
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, items, (resamples, items), generator=gen)
    ref_items, cand_items = ref.sum(0), cand.sum(0)  # [items], summed over rounds
    boot = ref_items[pick].sum(1) / cand_items[pick].sum(1)
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return PairedRatio(
        ratio=float(per_round.median()),
        ci95=(lo, hi),
        spread=(float(per_round.min()), float(per_round.max())),
        rounds=tuple(per_round.tolist()),
    )


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
"""Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..10 (standard tables); larger df
use 2.228 down to the normal 1.96 (a conservative bound)."""


def round_ratio(ratios: Sequence[float]) -> PairedRatio:
    """Median and t-interval of per-round speed ratios (module docstring); one round gives a
    zero-width interval at its ratio."""
    r = torch.tensor(list(ratios), dtype=torch.float64)
    if r.numel() == 0 or bool((r <= 0).any()):
        raise ValueError(f"need at least one round ratio > 0, got {list(ratios)}")
    n = r.numel()
    logs = r.log()
    if n == 1:
        lo = hi = float(r[0])
    else:
        t = T975[min(n - 2, len(T975) - 1)]
        half = t * float(logs.std()) / n**0.5
        lo, hi = math.exp(float(logs.mean()) - half), math.exp(float(logs.mean()) + half)
    return PairedRatio(
        ratio=float(r.median())
        if n % 2
        else float(r.sort().values[n // 2 - 1 : n // 2 + 1].mean()),
        ci95=(lo, hi),
        spread=(float(r.min()), float(r.max())),
        rounds=tuple(r.tolist()),
    )


def rotated(arms: Sequence[str], round_index: int) -> list[str]:
    """The arms' order in round ``round_index``: rotated by one each round."""
    k = round_index % len(arms) if arms else 0
    return [*arms[k:], *arms[:k]]


def cpu_name() -> str:
    """The CPU model as the kernel names it (``/proc/cpuinfo``), else the platform's guess."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"
