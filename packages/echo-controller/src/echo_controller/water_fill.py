"""Splitting one global verify budget across serving nodes by water-filling on marginal utility.

Node n reports ``u_n[j]``: the expected extra accepted tokens from its (j+1)-th budget token,
non-increasing in j (concave gain, e.g. the sorted acceptance estimates of its candidates), and
gets a floor ``f_n`` and a cap ``c_n``. The split maximises ``sum_n sum_{j < b_n} u_n[j]`` subject
to ``f_n <= b_n <= c_n`` and ``sum_n b_n <= G``:

1. every node gets its floor (``sum f_n <= G`` is required);
2. the remaining ``G - sum f`` tokens go one by one to the highest remaining marginal utility
   ``u_n[b_n]`` (ties: lower node index first), stopping early when none is positive.

Step 2 is the water-filling level: all tokens with utility above a level ``lambda`` are taken.
With non-increasing curves the greedy choice is optimal (exchange argument: moving a token from
a lower to a higher marginal utility never lowers the total), and it is computed in one sort of
all candidate tokens. Utilities past the end of a curve count as 0.

Worked example: curves ``[0.9, 0.5]``, ``[0.8, 0.7, 0.1]``, floors 0, caps 3, G = 3 gives
budgets ``[1, 2, 0]`` at level 0.7 (total utility 2.4).

Plain Python (lists of floats): the budget controller, its only user, runs without torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetSplit:
    budgets: tuple[int, ...]  # [n], f_n <= b_n <= c_n, sum <= G
    level: float  # utility of the last token given above the floors (0.0 when none was)
    utility: float  # total expected accepted tokens of the split, floors included


def water_fill(
    curves: Sequence[Sequence[float]],
    global_budget: int,
    floors: Sequence[int] | None = None,
    caps: Sequence[int] | None = None,
) -> BudgetSplit:
    """Split ``global_budget`` across ``len(curves)`` nodes (module docstring).

    Raises ``ValueError`` for a negative budget, floors or caps of the wrong length, a floor
    above its cap, floors summing above the budget, or a curve that is not finite and
    non-increasing."""
    n = len(curves)
    f = [0] * n if floors is None else [int(x) for x in floors]
    c = [global_budget] * n if caps is None else [int(x) for x in caps]
    us = [[float(v) for v in u] for u in curves]
    _check(us, global_budget, f, c)
    # Row-major (node asc, then slot asc), so the stable sort breaks ties by lower node index.
    tokens = [
        (u[j], i) for i, u in enumerate(us) for j in range(f[i], min(c[i], len(u))) if u[j] > 0
    ]
    taken = sorted(tokens, key=lambda t: -t[0])[: global_budget - sum(f)]
    budgets = list(f)
    for _, i in taken:
        budgets[i] += 1
    floor_utility = sum(sum(u[: f[i]]) for i, u in enumerate(us))
    level = taken[-1][0] if taken else 0.0
    return BudgetSplit(tuple(budgets), level, floor_utility + sum(v for v, _ in taken))


def _check(curves: list[list[float]], budget: int, floors: list[int], caps: list[int]) -> None:
    n = len(curves)
    if budget < 0:
        raise ValueError(f"global budget must be >= 0, got {budget}")
    if len(floors) != n or len(caps) != n:
        raise ValueError(
            f"floors and caps must have one entry per node ({n}), got {len(floors)}, {len(caps)}"
        )
    if any(f < 0 or c < f for f, c in zip(floors, caps, strict=True)):
        raise ValueError(f"need 0 <= floor <= cap, got {floors}, {caps}")
    if sum(floors) > budget:
        raise ValueError(f"floors sum to {sum(floors)} > global budget {budget}")
    for i, u in enumerate(curves):
        if not all(math.isfinite(v) for v in u):
            raise ValueError(f"curve {i} must be finite, got {u}")
        if any(b > a for a, b in itertools.pairwise(u)):
            raise ValueError(f"curve {i} must be non-increasing, got {u}")
