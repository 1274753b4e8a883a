"""Per-request tails of a replayed arm: who gains, and who is left without draft rows.

A global budget can favour confident requests; this measures what that costs the others. Needs
steps composed from request streams (each step names its requests, echo_lab.sim.rows). Per
request r (one stream visit), over the steps S_r where it is in the batch, with a_{r,i} its
accepted drafts and t_i the step's seconds under the arm (p_i under plain decoding):

    s_r = (sum_{i in S_r} (1 + a_{r,i}) / sum_{i in S_r} t_i) / (|S_r| / sum_{i in S_r} p_i)

its speedup over plain decoding on those steps. ``request_speedup_p10`` / ``_min`` are the 10th
percentile (linear interpolation) and minimum of s_r over requests present for at least
``MIN_STEPS`` steps (shorter visits say little). ``starved_max`` is the longest run of
consecutive steps in which a request verified no draft row while its batch verified some.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_lab.sim.trace import RecordedStep

MIN_STEPS = 3


@dataclass(frozen=True, slots=True)
class RequestTails:
    speedup_p10: float
    speedup_min: float
    starved_max: int
    requests: int  # requests with at least MIN_STEPS steps

    def as_row(self) -> dict[str, float | int | None]:
        """JSON fields (None where no request had ``MIN_STEPS`` steps)."""
        return {
            "request_speedup_p10": None if self.requests == 0 else self.speedup_p10,
            "request_speedup_min": None if self.requests == 0 else self.speedup_min,
            "starved_max": self.starved_max,
            "requests": self.requests,
        }


def request_tails(
    steps: Sequence[RecordedStep],
    accepted: Tensor,
    verified: Tensor,
    seconds: Tensor,
    plain_seconds: Tensor,
) -> RequestTails | None:
    """The module docstring's tails; ``accepted`` / ``verified``: [S, B] int64 per request and
    step, ``seconds`` / ``plain_seconds``: [S] float. None when the steps name no requests."""
    if not steps or any(st.requests is None for st in steps):
        return None
    tokens: dict[str, float] = {}
    taken: dict[str, float] = {}
    plain: dict[str, float] = {}
    count: dict[str, int] = {}
    run: dict[str, int] = {}
    starved = 0
    acc, ver = accepted.tolist(), verified.tolist()  # one host copy each
    sec, ref = seconds.tolist(), plain_seconds.tolist()
    for i, st in enumerate(steps):
        names = st.requests or ()
        any_rows = sum(ver[i]) > 0
        for b, r in enumerate(names):
            tokens[r] = tokens.get(r, 0.0) + 1.0 + acc[i][b]
            taken[r] = taken.get(r, 0.0) + sec[i]
            plain[r] = plain.get(r, 0.0) + ref[i]
            count[r] = count.get(r, 0) + 1
            if any_rows and ver[i][b] == 0:
                run[r] = run.get(r, 0) + 1
                starved = max(starved, run[r])
            else:
                run[r] = 0
    speed = [
        (tokens[r] / taken[r]) / (count[r] / plain[r])
        for r in tokens
        if count[r] >= MIN_STEPS and taken[r] > 0 and plain[r] > 0
    ]
    if not speed:
        return RequestTails(float("nan"), float("nan"), starved, 0)
    s = torch.tensor(speed, dtype=torch.float64)
    return RequestTails(float(torch.quantile(s, 0.1)), float(s.min()), starved, len(speed))
