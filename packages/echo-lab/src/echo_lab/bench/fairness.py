"""Per-request fairness: what each request of a run got, and against plain decoding.

An elastic budget gives draft rows to the requests whose nodes are most likely accepted. A
request that gets none still emits one token per step, but its steps grow slower with its batch
mates' rows; this module measures whether any request ends up slower than plain decoding.

Per request r of a run (:class:`RequestTimes`):

- ``tpot_r = (t_last - t_first) / (n_r - 1)``: seconds per output token after its first, the
  time its client waits per token once streaming (requests of a single token have none);
- its longest *passed-over run*: the most consecutive drafted steps (some request of the batch
  had a draft row verified) in which r had none. A step that drafts nobody (plain decoding, e.g.
  while the draft ledger says drafting does not pay) treats every request alike: it neither
  counts nor ends a run.

Against plain decoding in the same round, request r's speedup is ``tpot_r(plain) / tpot_r(run)``
(:func:`request_speedups`). A run's row reports the 10th percentile and the minimum over its
requests; the bench takes the median of each over rounds. Example: plain 0.10 s per token for
requests a, b; a policy 0.05 and 0.125: speedups 2.0 and 0.8, minimum 0.8 (b was slowed by 20%).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestTimes:
    """Per-request emission times and undrafted runs of one run (module docstring)."""

    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    streak: dict[str, int] = field(default_factory=dict)
    longest: dict[str, int] = field(default_factory=dict)

    def emitted(self, request_id: str, tokens: int, now: float) -> None:
        """Request ``request_id`` streamed ``tokens`` tokens at ``now`` (seconds)."""
        if tokens == 0:
            return
        self.first.setdefault(request_id, now)
        self.last[request_id] = now
        self.tokens[request_id] = self.tokens.get(request_id, 0) + tokens

    def verified(self, request_ids: Sequence[str], counts: Sequence[int]) -> None:
        """Count a decode pass: request ``request_ids[b]`` had ``counts[b]`` draft rows verified
        (>= 1: drafted; 0: passed over, unless nobody was drafted)."""
        if not any(counts):
            return
        for rid, n in zip(request_ids, counts, strict=True):
            run = 0 if n > 0 else self.streak.get(rid, 0) + 1
            self.streak[rid] = run
            self.longest[rid] = max(self.longest.get(rid, 0), run)

    def tpot(self) -> dict[str, float]:
        """``tpot_r`` of every request that streamed at least two tokens."""
        return {
            r: (self.last[r] - self.first[r]) / (n - 1)
            for r, n in self.tokens.items()
            if n > 1 and self.last[r] > self.first[r]
        }

    def longest_passed_over(self) -> int:
        """The longest passed-over run over the run's requests (0: nobody was ever passed over)."""
        return max(self.longest.values(), default=0)


def request_speedups(reference: Mapping[str, float], run: Mapping[str, float]) -> list[float]:
    """``tpot_r(reference) / tpot_r(run)`` for every request with a tpot in both, sorted."""
    return sorted(reference[r] / run[r] for r in reference.keys() & run.keys() if run[r] > 0)
