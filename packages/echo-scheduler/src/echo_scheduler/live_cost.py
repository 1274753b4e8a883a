"""The verify-cost curve corrected from live steps: a windowed median per row count.

The start-up profile ``p(T)`` (seconds of one verify pass over T rows) is measured once, and
one noisy measurement can give it a shape that is not the machine's (echo_scheduler.
profile_check). Every engine step times a verify pass whose row count ``T = B + N`` (B roots,
N draft rows) is known, so the engine hands :class:`LiveCost` one sample ``(T, seconds)`` per
step and it keeps, per row count T (a *bucket*), the last ``window`` samples no older than
``max_age`` samples overall. Its live estimate is their median ``m_T``: a median of ``n``
samples ignores up to ``ceil(n / 2) - 1`` outliers of any size, and a bucket forgets a change
of cost after at most ``floor(window / 2) + 1`` new samples (the window's median is then a new
one), so the estimate is outlier-resistant and decays, with no clock.

A bucket is *ready* with at least ``min_samples`` samples. The corrected curve ``c`` is defined
on the profile's points and the ready buckets' row counts together:

    c(T) = m_T                     T a ready bucket
    c(T) = m_hi + sigma (p(T) - p(T_hi))
                                   T above the largest ready bucket T_hi, when at least two are
                                   ready and p(T_hi) > p(T_lo) (T_lo the smallest), with
                                   sigma = max(0, (m_hi - m_lo) / (p(T_hi) - p(T_lo)))
    c(T) = p(T) rho(T)             otherwise,   rho(T) = m_T' / p(T') interpolated linearly in T
                                   between the nearest ready buckets T' below and above T
                                   (the nearest one's ratio past either end), except that when
                                   at least two are ready and the profile does not rise between
                                   them, p(T_hi) <= p(T_lo), the buckets' own mean slope
                                   lambda = max(0, (m_hi - m_lo) / (T_hi - T_lo)) bounds it:
                                   c(T) >= m_hi + lambda (T - T_hi) above T_hi and
                                   c(T) <= max(0, m_lo - lambda (T_lo - T)) below T_lo

then made non-decreasing (running maximum over T: more rows never cost less), interpolated
piecewise linearly like the profile (:class:`~echo_scheduler.cost.ProfileCost`). With one ready
bucket it is the profile scaled to it, what the elastic floor's global scale ``s`` does; each
further ready bucket replaces the profile's shape around it with the measured one. Past the
largest ready bucket the profile's *extra* cost is scaled by the ratio of marginal costs the
ready buckets show (``sigma``), not its level by the last bucket's ratio: a profile whose rows
are five times too dear (planted, profile_recovery.py) measured right on 1-4 rows would
otherwise still price every row past 4 at the wrong slope and keep ECHO's trees at 3 rows. A
profile flat over the ready span has no slope to scale, and scaled it prices every row outside
the ready span as free: with the planted "cheap" profile (every pass priced as one row) ECHO at
c = 8 verified 16 draft rows in 323 of 360 steps, the rows from 8 to 19 looking free below the
lowest ready bucket (19), and ran at 0.93x of a clean start on the AMD EPYC VM. The measured
slope ``lambda`` then bounds the curve on both sides, so the rows below and above the measured
ones cost at least what the measured ones do per row, the cut verifies fewer rows, and their
row counts get timed too. Where the profile is right and flat (1-6 rows on a CPU) ``lambda``
is about 0 and the bounds leave the scaled profile alone.

:meth:`LiveCost.refresh` returns a new curve only when some ready bucket's estimate moved by
more than ``swap_tolerance`` (relative) from what the curve in use was built on (or, for a bucket
not used then, from the curve), so a profile the live steps confirm is never replaced and a
consumer (the floor, K) changes only on evidence.

Exploration. If a wrong profile prices draft rows so dear that nothing is drafted, only
``T = B`` is observed and the correction above is a scaling of the wrong shape. The floor's
price is a price, not a ban (a node whose acceptance beats ``u_min`` is still verified, and
every such step fills a draft-row bucket), and ECHO's ledger probes drafting on a doubling clock
(echo_scheduler.ledger), but neither verifies a row that the wrong price refuses: at c = 1 a
profile pricing each row at half a pass kept ECHO at 0.80x of a clean start for 500 steps
(packages/echo-lab/scripts/profile_recovery.py, 2026-12-05). So the engine explores: while a
row count just above the batch has no ready bucket (:meth:`LiveCost.is_ready`), a step after
ECHO's pre-check has refused every row for ``EXPLORE_AFTER`` (4) steps in a row verifies that
many rows whatever their price (engine/cost_feedback.py, ``ElasticFloor.explore_rows``,
echo_scheduler.policies.echo). The
start-up profile must also pass echo_scheduler.profile_check, on load as well as when measured,
so the shape that stopped drafting on 2026-12-05 is not used at all.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from echo_scheduler.cost import ProfileCost
from echo_scheduler.errors import CostModelError
from echo_scheduler.profile_check import envelope, median

WINDOW = 32
"""Samples kept per bucket. Its median moves past a change of cost after ``WINDOW // 2 + 1`` =
17 new samples, about half a second of steps on the 2-core VM at 30 ms per step, and it
ignores up to 15 outliers among 32: a burst of contention as long as 15 steps in a row."""

MIN_SAMPLES = 8
"""Samples before a bucket's median is used (the bucket is *ready*). The median of 8 ignores 3
outliers; fewer would let two stalls in a row (a page fault, a GC pause, the OS scheduler giving
the core away) set the price of a row count. The floor and K wait at most this many steps at
that row count before they see a correction."""

MAX_AGE = 4096
"""Overall samples (steps) after which a sample is dropped from its bucket, so that a row count
seen once long ago (a burst of load) does not price it for the rest of the run: about two
minutes of steps at 30 ms, longer than the minutes over which the dev VM was seen to change
speed (scripts/measure_cpu_cost.py's docstring)."""

SWAP_TOLERANCE = 0.10
"""Relative difference of a ready bucket's median from the curve in use above which
:meth:`LiveCost.refresh` gives a new curve: the 10% under which echo_scheduler.profile_check
treats two timings as the same cost; a smaller difference is noise and leaves the curve alone."""

MAX_BUCKETS = 256
"""Row counts tracked at once; past it the least recently sampled bucket is dropped. A serving
node verifies at most ``max_batch + K`` rows, a few hundred at the largest settings."""


@dataclass(frozen=True, slots=True)
class BucketEstimate:
    """One row count's live estimate next to the profile (None where there is none)."""

    rows: int
    samples: int
    live_s: float | None  # m_T once the bucket is ready
    profile_s: float | None  # p(T)
    curve_s: float | None  # c(T) of the curve in use


class _Bucket:
    __slots__ = ("_median", "samples")

    def __init__(self, window: int) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)  # (sample number, seconds)
        self._median: float | None = None

    def add(self, serial: int, seconds: float) -> None:
        self.samples.append((serial, seconds))
        self._median = None

    def expire(self, oldest: int) -> None:
        while self.samples and self.samples[0][0] < oldest:
            self.samples.popleft()
            self._median = None

    def median(self) -> float:
        if self._median is None:
            self._median = median([s for _, s in self.samples])
        return self._median


class LiveCost:
    """Per-row-count windowed medians of live verify times and the corrected curve (module
    docstring). Pure: it never reads a clock; the caller passes ``(rows, seconds)``."""

    def __init__(
        self,
        profile: ProfileCost | None,
        window: int = WINDOW,
        min_samples: int = MIN_SAMPLES,
        max_age: int = MAX_AGE,
        swap_tolerance: float = SWAP_TOLERANCE,
    ) -> None:
        if not 1 <= min_samples <= window or max_age < window:
            raise CostModelError(
                f"need 1 <= min_samples <= window <= max_age, got {min_samples}, {window}, "
                f"{max_age}"
            )
        if not 0.0 <= swap_tolerance < math.inf:
            raise CostModelError(f"swap_tolerance must be finite and >= 0, got {swap_tolerance}")
        self.profile = profile
        self.window, self.min_samples, self.max_age = window, min_samples, max_age
        self.swap_tolerance = swap_tolerance
        self.curve: ProfileCost | None = profile  # the curve in use (refresh)
        self.swaps = 0
        self.observed = 0
        self._buckets: dict[int, _Bucket] = {}
        self._anchors: dict[int, float] = {}  # m_T of the buckets the curve in use was built on

    def observe(self, rows: int, seconds: float) -> None:
        """One verify pass over ``rows`` rows took ``seconds``; non-finite or <= 0 is ignored
        (a pass that was not timed)."""
        if rows < 1:
            raise CostModelError(f"a verify pass has >= 1 row, got {rows}")
        if not (math.isfinite(seconds) and seconds > 0):
            return
        bucket = self._buckets.pop(rows, None) or _Bucket(self.window)
        self._buckets[rows] = bucket  # most recently sampled last
        if len(self._buckets) > MAX_BUCKETS:
            del self._buckets[next(iter(self._buckets))]
        bucket.add(self.observed, seconds)
        self.observed += 1

    def ready(self) -> dict[int, float]:
        """``{T: m_T}`` of the ready buckets (old samples expired first)."""
        oldest = self.observed - self.max_age
        out: dict[int, float] = {}
        for rows, bucket in list(self._buckets.items()):
            bucket.expire(oldest)
            if not bucket.samples:
                del self._buckets[rows]
            elif len(bucket.samples) >= self.min_samples:
                out[rows] = bucket.median()
        return dict(sorted(out.items()))

    def is_ready(self, rows: int) -> bool:
        """Whether ``rows``' bucket is ready (its old samples expired first): a count, no
        median, cheap enough for every step."""
        bucket = self._buckets.get(rows)
        if bucket is None:
            return False
        bucket.expire(self.observed - self.max_age)
        return len(bucket.samples) >= self.min_samples

    def estimate(self, rows: int) -> float | None:
        """``m_T`` for ``rows`` once its bucket is ready, else None."""
        return self.ready().get(rows)

    def corrected(self) -> ProfileCost | None:
        """The corrected curve ``c`` from the buckets ready now (module docstring); the profile
        while none is; None without a profile until two buckets are ready."""
        live = self.ready()
        p = self.profile
        if not live:
            return p
        if p is None:
            if len(live) < 2:
                return None
            grid = sorted(live)
            return ProfileCost(tuple(map(float, grid)), tuple(envelope([live[t] for t in grid])))
        ratios = [(float(t), m / max(p.latency_at(t), 1e-12)) for t, m in live.items()]
        lo, hi = min(live), max(live)
        rise, climb = p.latency_at(hi) - p.latency_at(lo), live[hi] - live[lo]
        sigma = lam = None
        if len(live) >= 2 and rise > 0:
            sigma = max(0.0, climb / rise)
        elif len(live) >= 2:
            lam = max(0.0, climb / (hi - lo))
        grid_t = sorted({*(float(t) for t in live), *p.tokens})
        values = []
        for t in grid_t:
            exact = live.get(int(t)) if t.is_integer() else None
            if exact is not None:
                values.append(exact)
            elif sigma is not None and t > hi:
                values.append(live[hi] + sigma * (p.latency_at(t) - p.latency_at(hi)))
            else:
                scaled = p.latency_at(t) * _ratio(ratios, t)
                if lam is not None and t > hi:
                    scaled = max(scaled, live[hi] + lam * (t - hi))
                elif lam is not None and t < lo:
                    scaled = min(scaled, max(0.0, live[lo] - lam * (lo - t)))
                values.append(scaled)
        return ProfileCost(tuple(grid_t), tuple(envelope(values)))

    def refresh(self) -> ProfileCost | None:
        """A new curve in use when some ready bucket's ``m_T`` differs by more than
        ``swap_tolerance`` (relative) from its reference, else None (keep the current one).

        A bucket's reference is its median when the curve in use was built (its *anchor*), or,
        for a bucket that was not ready then, the current curve at T. Comparing with the anchor,
        not the curve, keeps a bucket the envelope lifted (a median below a smaller row count's)
        from asking for a new curve at every step."""
        live = self.ready()
        if not live:
            return None
        current, tol = self.curve, self.swap_tolerance
        changed = False
        for t, m in live.items():
            ref = self._anchors.get(t)
            if ref is None and current is not None:
                ref = current.latency_at(t)
            if ref is None or abs(m - ref) > tol * ref:
                changed = True
                break
        if not changed:
            return None
        new = self.corrected()
        if new is None:
            return None
        self.curve, self._anchors = new, live
        self.swaps += 1
        return new

    def buckets(self) -> list[BucketEstimate]:
        """Every tracked row count and every profile point, by rows (for metrics and reports)."""
        live = self.ready()
        counts = {t: len(b.samples) for t, b in self._buckets.items()}
        p, c = self.profile, self.curve
        rows = sorted({*counts, *(int(t) for t in (p.tokens if p else ()) if t.is_integer())})
        return [
            BucketEstimate(
                t,
                counts.get(t, 0),
                live.get(t),
                p.latency_at(t) if p is not None else None,
                c.latency_at(t) if c is not None else None,
            )
            for t in rows
        ]


def _ratio(ratios: list[tuple[float, float]], t: float) -> float:
    """``rho(t)``: the ratios of the ready buckets (sorted by T) interpolated linearly in T,
    the nearest one's past either end."""
    ts = [r[0] for r in ratios]
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return ratios[0][1]
    if i == len(ratios):
        return ratios[-1][1]
    (t0, r0), (t1, r1) = ratios[i - 1], ratios[i]
    return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
