"""Is a measured verify-cost profile a cost curve, or noise? The checks a profile must pass.

A profile is timed in ``n`` interleaved rounds: ``x[i][r]`` seconds for one verify pass over
``T_i`` tokens in round ``r`` (echo-server's engine/profile_store.py), with a reference pass
(``T = 1``) timed before the rounds and after them. Its value at ``T_i`` is the median
``y_i = med_r x[i][r]``. It is accepted only if all three hold:

1. Rounds agree. Per point the relative median absolute deviation
   ``d_i = med_r |x[i][r] - y_i| / y_i``; the profile's spread is ``max_i d_i`` and must be at
   most ``ROUND_TOLERANCE``.
2. The monotone envelope lifts by no more than noise. More rows never cost less, so the
   envelope ``e_i = max_{j <= i} y_j`` (running maximum over T) is what a cost curve looks like;
   the lift ``(e_i - y_i) / y_i`` of every point must be at most ``ENVELOPE_TOLERANCE``.
3. No drift. With ``a`` and ``b`` the reference pass before and after,
   ``max(a, b) / min(a, b) <= 1 + DRIFT_TOLERANCE``: a machine that changed speed while the
   profile was timed gave it a shape that is not its own.

The profile the AMD EPYC VM cached under load on 2026-12-05 (1 row 33.8 ms, 2 rows 49.2, 3 rows
44.4, 4 rows 32.9, 7 rows 56.3, 8 rows 37.2) fails check 2 whatever its rounds said: its
envelope lifts the 4-row point by 50% and the 8-row point by 51%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from echo_scheduler.errors import CostModelError

ROUND_TOLERANCE = 0.10
"""Largest relative median absolute deviation of a point's rounds (check 1). 10% is the drift
tolerance of scripts/measure_cpu_cost.py (``--max-drift 1.10``), the bound under which this
project already treats two timings of one pass as the same cost; on a quiet machine a point's
rounds agree within a few percent (the EPYC's 1-6 row passes are within 6% of one another:
a one-off script, bench_row_staircase.py at 87d8d57), so a profile beyond it was timed while
something else ran."""

ENVELOPE_TOLERANCE = ROUND_TOLERANCE
"""Largest lift of a point by the running maximum (check 2). Two points of equal cost whose
medians each stray by up to the round tolerance can invert by about that much, so a larger lift
is a shape, not noise: the same 10%, not a separate knob."""

DRIFT_TOLERANCE = ROUND_TOLERANCE
"""Largest relative change of the reference pass from before the rounds to after them (check
3): the ``--max-drift 1.10`` of scripts/measure_cpu_cost.py."""


@dataclass(frozen=True, slots=True)
class ProfileRounds:
    """Raw timings of one profile measurement (module docstring): ``rounds[i]`` the seconds of
    every round at ``tokens[i]``, ``reference_s`` the reference pass before and after."""

    tokens: tuple[int, ...]
    rounds: tuple[tuple[float, ...], ...]
    reference_s: tuple[float, float]

    def __post_init__(self) -> None:
        if len(self.tokens) < 2 or len(self.tokens) != len(self.rounds):
            raise CostModelError(
                f"need >= 2 token counts, one list of rounds each: {len(self.tokens)}, "
                f"{len(self.rounds)}"
            )
        if any(b <= a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise CostModelError(f"token counts must be strictly increasing, got {self.tokens}")
        values = [x for r in self.rounds for x in r] + list(self.reference_s)
        if any(not r for r in self.rounds) or not all(math.isfinite(v) and v > 0 for v in values):
            raise CostModelError("every point needs >= 1 round, every time finite and > 0")

    def medians(self) -> tuple[float, ...]:
        """``y_i``, the median of each point's rounds."""
        return tuple(median(r) for r in self.rounds)

    def pooled(self, other: ProfileRounds) -> ProfileRounds:
        """Both measurements' rounds per point (same tokens), the wider reference pair."""
        if other.tokens != self.tokens:
            raise CostModelError("can only pool measurements of the same token counts")
        refs = (*self.reference_s, *other.reference_s)
        return ProfileRounds(
            self.tokens,
            tuple((*a, *b) for a, b in zip(self.rounds, other.rounds, strict=True)),
            (min(refs), max(refs)),
        )


@dataclass(frozen=True, slots=True)
class ProfileCheck:
    """The three measures of the module docstring and whether each is within tolerance."""

    spread: float  # max_i d_i
    lift: float  # max_i (e_i - y_i) / y_i
    drift: float  # max(a, b) / min(a, b) - 1
    round_tolerance: float = ROUND_TOLERANCE
    envelope_tolerance: float = ENVELOPE_TOLERANCE
    drift_tolerance: float = DRIFT_TOLERANCE

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why the profile is rejected, one phrase per failed check (empty: accepted)."""
        out = []
        if self.spread > self.round_tolerance:
            out.append(f"rounds disagree ({self.spread:.1%} > {self.round_tolerance:.0%})")
        if self.lift > self.envelope_tolerance:
            out.append(f"not monotone ({self.lift:.1%} lift > {self.envelope_tolerance:.0%})")
        if self.drift > self.drift_tolerance:
            out.append(f"machine drifted ({self.drift:.1%} > {self.drift_tolerance:.0%})")
        return tuple(out)

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def badness(self) -> float:
        """The largest measure over its tolerance (< 1 iff accepted); ranks failed attempts."""
        return max(
            self.spread / self.round_tolerance,
            self.lift / self.envelope_tolerance,
            self.drift / self.drift_tolerance,
        )


def median(values: Sequence[float]) -> float:
    """The median (mean of the middle two for an even count)."""
    if not values:
        raise CostModelError("median of no values")
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def envelope(values: Sequence[float]) -> list[float]:
    """``e_i = max_{j <= i} values_j``, the running maximum."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else max(out[-1], v))
    return out


def check_profile(
    rounds: ProfileRounds,
    round_tolerance: float = ROUND_TOLERANCE,
    envelope_tolerance: float = ENVELOPE_TOLERANCE,
    drift_tolerance: float = DRIFT_TOLERANCE,
) -> ProfileCheck:
    """The three checks of the module docstring on one measurement."""
    ys = rounds.medians()
    spread = max(
        median([abs(x - y) for x in xs]) / y for xs, y in zip(rounds.rounds, ys, strict=True)
    )
    lift = max((e - y) / y for e, y in zip(envelope(ys), ys, strict=True))
    a, b = rounds.reference_s
    drift = max(a, b) / min(a, b) - 1.0
    return ProfileCheck(spread, lift, drift, round_tolerance, envelope_tolerance, drift_tolerance)
