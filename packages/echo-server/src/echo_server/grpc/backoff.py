"""Jittered exponential backoff between retries of a control-plane call."""

from __future__ import annotations

import random


class Backoff:
    """The n-th consecutive wait (n >= 1) is drawn uniformly from ``[d_n / 2, d_n]`` with
    ``d_n = min(cap_s, base_s * 2^(n-1))`` ("equal jitter"): it never drops below half the
    exponential schedule, and two processes that failed at the same moment drift apart.

    Example: base 0.5 s, cap 30 s: waits in [0.25, 0.5], [0.5, 1], [1, 2], ... then [15, 30].
    With ``jitter=False`` the wait is ``d_n`` itself (plain doubling up to the cap).
    """

    def __init__(
        self,
        base_s: float,
        cap_s: float,
        rng: random.Random | None = None,
        *,
        jitter: bool = True,
    ) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {base_s}, {cap_s}")
        self.base_s, self.cap_s, self.jitter = base_s, cap_s, jitter
        self._rng = rng or random.Random()
        self.attempts = 0  # consecutive failures since the last reset

    def next(self) -> float:
        """The wait before the next attempt (counts one more failure)."""
        self.attempts += 1
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.attempts - 1, 62))
        return self._rng.uniform(ceiling / 2, ceiling) if self.jitter else ceiling

    def reset(self) -> None:
        self.attempts = 0
