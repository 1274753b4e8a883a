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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_scheduler.errors import SchedulerError


@dataclass(frozen=True, slots=True)
class BudgetSplit:
    budgets: Tensor  # [n] int64, f_n <= b_n <= c_n, sum <= G
    level: float  # utility of the last token given above the floors (0.0 when none was)
    utility: float  # total expected accepted tokens of the split, floors included


def water_fill(
    curves: Sequence[Tensor],
    global_budget: int,
    floors: Tensor | None = None,
    caps: Tensor | None = None,
) -> BudgetSplit:
    """Split ``global_budget`` across ``len(curves)`` nodes (module docstring)."""
    n = len(curves)
    f = torch.zeros(n, dtype=torch.int64) if floors is None else floors.to(torch.int64).cpu()
    c = torch.full((n,), global_budget, dtype=torch.int64) if caps is None else caps.to(torch.int64)
    c = c.cpu()
    _check(curves, global_budget, f, c)
    length = max([int(u.numel()) for u in curves] + [0])
    table = torch.zeros(n, length + 1, dtype=torch.float64)  # padded with utility 0
    for i, u in enumerate(curves):
        table[i, : u.numel()] = u.detach().to(torch.float64).cpu()
    j = torch.arange(length + 1)
    above_floor = (j >= f.unsqueeze(1)) & (j < c.unsqueeze(1)) & (table > 0)
    node, slot = above_floor.nonzero(as_tuple=True)  # row-major: node asc, then slot asc
    value = table[node, slot]
    order = torch.sort(value, descending=True, stable=True).indices
    take = order[: global_budget - int(f.sum())]
    budgets = f + torch.bincount(node[take], minlength=n)
    floor_utility = float((table * (j < f.unsqueeze(1))).sum())
    level = float(value[take[-1]]) if take.numel() else 0.0
    return BudgetSplit(budgets, level, floor_utility + float(value[take].sum()))


def _check(curves: Sequence[Tensor], budget: int, floors: Tensor, caps: Tensor) -> None:
    n = len(curves)
    if budget < 0:
        raise SchedulerError(f"global budget must be >= 0, got {budget}")
    if floors.shape != (n,) or caps.shape != (n,):
        raise SchedulerError(
            f"floors and caps must have one entry per node ({n}), got {tuple(floors.shape)}, "
            f"{tuple(caps.shape)}"
        )
    if bool((floors < 0).any() | (caps < floors).any()):
        raise SchedulerError(f"need 0 <= floor <= cap, got {floors.tolist()}, {caps.tolist()}")
    if int(floors.sum()) > budget:
        raise SchedulerError(f"floors sum to {int(floors.sum())} > global budget {budget}")
    for i, u in enumerate(curves):
        if u.dim() != 1 or not bool(torch.isfinite(u).all()):
            raise SchedulerError(f"curve {i} must be a finite 1-D tensor, got {tuple(u.shape)}")
        if u.numel() > 1 and bool((u[1:] > u[:-1]).any()):
            raise SchedulerError(f"curve {i} must be non-increasing, got {u.tolist()}")
