"""Does drafting pay at all? The realised net value of the steps a policy drafted, learned online.

The cost floor (echo_scheduler.elastic) prices every verify row and every expansion *after* the
drafter has spoken, but a step's first drafter call (every live root expanded) is made before
any draft confidence is known. Its only pre-check is optimistic (the best a depth-1 node could
be worth), so under saturation ECHO kept paying for root expansions whose rows the floor then
refused: on the dev CPU at batch 16 the replay had it verify 2.2 rows per step for 1.4 accepted
tokens and lose 12% against plain decoding.

The ledger closes that loop with what the steps actually returned. For a drafted step, in
tokens at the step's own prices (p_node an expansion's, p_call a drafter call's):

    V = A - c_rows - p_node E - p_call C,   c_rows = R_run (t(B + N) - t(B))

with A accepted drafts, N verified draft rows, E expansions (roots included), C drafter calls,
and c_rows the exact price of the step's N rows at the run rate ``R_run`` under the verify
profile (the exact cut's :class:`~echo_scheduler.interface.RowPrice`; ``u_min N`` when the
step has none). It keeps exponential moving averages (weight ``alpha``) of the per-root value
``v = (A - c_rows - p_node E) / R`` (R roots expanded) and of C, per batch-size bucket
``round(log2 L)`` (L live requests: prices change with load, so a value learned at 16 requests
says nothing about one). The buckets are centred on powers of two (1 | 2 | 3-5 | 6-11 | 12-22 |
23-45 | ...), where servers and benches set their concurrency: with ``floor(log2 L)`` a batch of
8 that lost a request (L = 7) fell into another bucket and was learned from scratch. A step over
L live requests is predicted to gain

    G = L v - C p_call

tokens from drafting.

Measured drafting. When the caller timed the step's draft phase (the engine does: every drafter
call and the policy's own work, d seconds), the modelled drafting prices are replaced by what
it cost beyond an undrafted step's set-up ``d_0`` (the policy's moving average of undrafted
steps' draft phases), ``c_draft = R_run max(d - d_0, 0)`` tokens:

    V = A - c_rows - c_draft,   v = V / R,   and C counts as 0 in G

The modelled prices come from a least-squares fit over recent steps and omit the step's fixed
work (the policy's selection, the drafter's per-step set-up); on the dev CPU at concurrency 8
on MT-Bench they undercharged a drafted step by about 0.2 tokens, enough for the ledger to keep
drafting at a loss (docs/BENCHMARKS.md). The policy drafts when G >= 0 or the bucket has no
drafted step yet; else
it decodes plainly and probes: it drafts again after ``period`` skipped steps, the period
doubling from ``probe_min`` to ``probe_max`` after every probe that leaves G < 0 and resetting
once G >= 0. Probing costs at most ``1 / (probe_min + 1)`` of the steps and keeps the estimate
current when the workload or the drafter changes.

ECHO keeps two ledgers, one for full drafting and one for depth 1 only, and a
:class:`ModeChooser` picks the mode of each step from them: the one with the larger gain G,
plain decoding while both lose. Asking only "does full drafting pay?" kept ECHO drafting in full
whenever that was barely positive, although depth 1 alone paid more: at concurrency 8 on the
Intel Xeon VM a fixed one-token draft per request (``static`` at K = 8) ran 5% ahead of ECHO
(docs/lab/2026-12-02.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from echo_scheduler.errors import PolicyError


@dataclass(frozen=True, slots=True)
class DraftedStep:
    """What one drafted step cost and returned (module docstring), prices in tokens."""

    live: int  # L, requests allowed to draft
    roots: int  # R, roots expanded
    accepted: int  # A
    verified: int  # N
    expansions: int  # E, roots included
    calls: int  # C
    row_cost: float  # c_rows, tokens
    node_price: float  # p_node
    call_price: float  # p_call
    draft_cost: float | None = None  # c_draft = R_run d, tokens (None: drafting not timed)

    def per_root(self) -> float:
        """``v = (A - c_rows - p_node E) / R``, or ``(A - c_rows - c_draft) / R`` when the
        drafting was timed."""
        spent = self.node_price * self.expansions if self.draft_cost is None else self.draft_cost
        return (self.accepted - self.row_cost - spent) / max(self.roots, 1)

    def priced_calls(self) -> int:
        """C, the calls still to be charged at ``p_call`` (0 when the drafting was timed)."""
        return self.calls if self.draft_cost is None else 0

    def value(self) -> float:
        """``V = A - c_rows - p_node E - p_call C``, or ``A - c_rows - c_draft`` when timed."""
        return self.per_root() * max(self.roots, 1) - self.call_price * self.priced_calls()


@dataclass(slots=True)
class _Bucket:
    per_root: float | None = None  # EMA of v
    square: float = 0.0  # EMA of v^2
    calls: float = 0.0  # EMA of C (priced calls: 0 for timed steps)
    skipped: int = 0  # plain steps since the last drafted one
    period: int = 0  # skipped steps before the next probe (0: not probing)
    drafted: int = 0
    probes: int = 0


@dataclass(slots=True)
class DraftLedger:
    """Per-bucket moving averages and the draft / probe decision (module docstring)."""

    alpha: float = 0.25
    z: float = 1.0
    min_drafted: int = 3
    probe_min: int = 4
    probe_max: int = 64
    _buckets: dict[int, _Bucket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise PolicyError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 1 <= self.probe_min <= self.probe_max:
            raise PolicyError(
                f"need 1 <= probe_min <= probe_max, got {self.probe_min}, {self.probe_max}"
            )

    @staticmethod
    def bucket(live: int) -> int:
        """``round(log2 L)`` for L >= 1 (0 for L <= 1), exactly in integers: k with
        ``2^(2k-1) <= L^2 < 2^(2k+1)``, i.e. ``bit_length(L^2) // 2``."""
        live = max(live, 1)
        return (live * live).bit_length() // 2

    def gain(self, live: int, call_price: float, z: float | None = None) -> float | None:
        """``G = L (v + z se) - C p_call`` for a step over ``live`` requests (``z``: the
        ledger's own by default, 0 for the mean); None before ``min_drafted`` drafted steps in
        its bucket."""
        b = self._buckets.get(self.bucket(live))
        if b is None or b.per_root is None or b.drafted < self.min_drafted:
            return None
        n = min(b.drafted, (2.0 - self.alpha) / self.alpha)
        se = math.sqrt(max(b.square - b.per_root**2, 0.0) / n)
        return live * (b.per_root + (self.z if z is None else z) * se) - b.calls * call_price

    def should_draft(self, live: int, call_price: float) -> bool:
        """Draft this step? Advances the bucket's probe clock when the answer is a plain step."""
        if live <= 0:
            return False
        g = self.gain(live, call_price)
        if g is None or g >= 0:
            return True
        b = self._buckets[self.bucket(live)]
        if b.period == 0:
            b.period = self.probe_min
        if b.skipped >= b.period:
            b.probes += 1
            b.period = min(2 * b.period, self.probe_max)
            return True
        b.skipped += 1
        return False

    def record(self, step: DraftedStep) -> None:
        """Fold one drafted step into its bucket."""
        if step.roots <= 0:
            raise PolicyError("only drafted steps (roots > 0) are recorded")
        if step.draft_cost is not None and not 0.0 <= step.draft_cost < math.inf:
            raise PolicyError(f"draft_cost must be finite and >= 0, got {step.draft_cost}")
        b = self._buckets.setdefault(self.bucket(step.live), _Bucket())
        v = step.per_root()
        b.drafted += 1
        if b.per_root is None:
            b.per_root, b.square, b.calls = v, v * v, float(step.priced_calls())
        else:
            a = max(self.alpha, 1.0 / b.drafted)  # plain means while few steps are in
            b.per_root += a * (v - b.per_root)
            b.square += a * (v * v - b.square)
            b.calls += a * (step.priced_calls() - b.calls)
        b.skipped = 0
        g = self.gain(step.live, step.call_price)
        if g is not None and g >= 0:
            b.period = 0

    def summary(self) -> dict[int, dict[str, float]]:
        """Per bucket: ``per_root``, ``calls``, ``drafted``, ``probes`` (for logs and reports)."""
        return {
            k: {
                "per_root": float("nan") if b.per_root is None else b.per_root,
                "calls": b.calls,
                "drafted": float(b.drafted),
                "probes": float(b.probes),
            }
            for k, b in sorted(self._buckets.items())
        }


Mode = Literal["full", "shallow", "plain"]


@dataclass(slots=True)
class _Clock:
    skipped: int = 0
    period: int = 0  # 0: not probing


@dataclass(slots=True)
class ModeChooser:
    """The drafting mode of a step from two ledgers: ``full`` drafting or depth 1 only
    (``shallow``), or ``plain`` decoding.

    With ``G_f`` and ``G_s`` the ledgers' gains for the step's L live requests
    (:meth:`DraftLedger.gain`, each an upper bound at the ledger's ``z``):

    - a mode whose bucket has fewer than ``min_drafted`` steps is drafted first: full drafting,
      then depth 1 while full drafting's gain is not clearly positive (its lower bound
      ``g_f - z s_f < 0``, ``g_f`` the mean, ``s_f`` its standard error). Full drafting already
      stops at the depth where one more call stops paying at the step's prices, so depth 1 only
      can beat it only when those prices are wrong (the engine's measured drafting, not the
      modelled one, says so) or when full drafting barely pays; where it clearly pays, depth 1
      is measured on its probe clock instead of up front. In the deterministic replay
      (modelled prices, 20 steps per cell) measuring depth 1 up front in every bucket cost
      ECHO 1-9% on the GPU cost models (docs/BENCHMARKS.md);
    - ``max(G_f, G_s) >= 0``: the larger *mean* gain (``z = 0``) wins, full drafting on a tie;
      comparing upper bounds would favour the noisier mode, full drafting, whose value varies
      more from step to step. The other mode is still drafted when its probe clock (per mode
      and bucket: ``period`` skipped steps while it loses, doubling from ``probe_min`` to
      ``probe_max`` after each probe, restarted whenever the mode wins) says so, to keep its
      estimate current. Where the means cross often the loser is probed often; two ways of
      probing it less (a sticky incumbent, clocks never restarted) both lowered the demo's
      mean accepted length at batch 1 from 1.60-1.66 to 1.41-1.60 and its speedup with it
      (docs/lab/2026-12-03.md);
    - both < 0: plain decoding, each ledger probing on its own clock
      (:meth:`DraftLedger.should_draft`), full drafting first.
    """

    full: DraftLedger
    shallow: DraftLedger
    _clocks: dict[tuple[str, int], _Clock] = field(default_factory=dict)
    exploring: bool = False
    """Whether the last :meth:`choose` drafts to learn rather than because drafting is expected
    to pay: the mode's first ``min_drafted`` steps in a bucket, or a probe of a losing mode."""

    def choose(self, live: int, call_price: float) -> Mode:
        """This step's mode (class docstring); advances the probe clocks and sets
        :attr:`exploring`."""
        self.exploring = False
        return self._choose(live, call_price)

    def _choose(self, live: int, call_price: float) -> Mode:
        if live <= 0:
            return "plain"
        g_full, g_shallow = self.full.gain(live, call_price), self.shallow.gain(live, call_price)
        if g_full is None:
            self.exploring = True
            return "full"
        bucket = DraftLedger.bucket(live)
        if g_shallow is None:
            low = self.full.gain(live, call_price, -self.full.z)
            if low is None or low < 0 or self._due("shallow", bucket):
                self.exploring = True
                return "shallow"  # full drafting barely pays: measure depth 1 (or its probe)
            return "full"
        if max(g_full, g_shallow) < 0:  # both lose: a drafted step here is a probe
            mode: Mode = "plain"
            if self.full.should_draft(live, call_price):
                mode = "full"
            elif self.shallow.should_draft(live, call_price):
                mode = "shallow"
            self.exploring = mode != "plain"
            return mode
        mean_full, mean_shallow = (
            self.full.gain(live, call_price, 0.0),
            self.shallow.gain(live, call_price, 0.0),
        )
        assert mean_full is not None  # known, as its bound is
        assert mean_shallow is not None
        best: Mode = "full" if mean_full >= mean_shallow else "shallow"
        other: Mode = "shallow" if best == "full" else "full"
        self._clocks[(best, bucket)] = _Clock()  # the winner's clock restarts
        if self._due(other, bucket):
            self.exploring = True
            return other
        return best

    def _ledger(self, mode: Mode) -> DraftLedger:
        return self.full if mode == "full" else self.shallow

    def _due(self, mode: Mode, bucket: int) -> bool:
        """Whether the losing ``mode`` is probed now (class docstring)."""
        clock = self._clocks.setdefault((mode, bucket), _Clock())
        ledger = self._ledger(mode)
        if clock.period == 0:
            clock.period = ledger.probe_min
        if clock.skipped >= clock.period:
            clock.skipped = 0
            clock.period = min(2 * clock.period, ledger.probe_max)
            return True
        clock.skipped += 1
        return False
