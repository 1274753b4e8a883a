"""The exact per-step cut: how many of a policy's selected rows are worth verifying.

With the selected nodes' keys ``u`` (estimated acceptances, non-increasing along every path)
sorted in decreasing order, verifying the best k rows earns ``G(k) = u_(1) + ... + u_(k)``
expected tokens and takes ``t(B + k)`` seconds. At run rate ``lam`` (tokens per second) the
step's net worth is

    W(k) = G(k) - lam t(B + k),   k* = argmax_{min(m, n) <= k <= n} W(k)

(Dinkelbach's step towards the best run rate ``sum tokens / sum seconds``; exact for any shape of
``t``, concave at a CPU's start or a hinge past a GPU's knee, where a per-row floor from an
average slope is not). ``k* = 0`` is plain decoding. Only cuts between distinct key values are
admissible, so the kept set ``{u >= u_(k*)}`` stays ancestor-closed (a parent's key is at least
its child's). ``m`` (``min_rows``, 0 by default) is the exploration of a cost model that has
never seen a row count: the best ``m`` rows are kept whatever they are priced at, so the verify
pass times that row count (engine/cost_feedback.py); the cut above ``m`` is still the best one.

Worked example: B = 2, keys (0.9, 0.5, 0.05), ``t(2..5)`` = 10, 10, 11, 12 ms, lam = 100
tokens/s: ``W(0..3)`` = 0 - 1.0, 0.9 - 1.0, 1.4 - 1.1, 1.45 - 1.2 = -1.0, -0.1, 0.3, 0.25: keep
the two best rows (the third earns 0.05 tokens for 1 ms, worth 0.1 at 100 tokens/s).
"""

from __future__ import annotations

import torch
from torch import Tensor

from echo_scheduler.interface import RowPrice


def exact_cut(key: Tensor, keep: Tensor, batch: int, price: RowPrice, min_rows: int = 0) -> Tensor:
    """``keep`` ([N] bool, ancestor-closed) cut to its ``k*`` best rows by ``key`` ([N]), at
    least ``min_rows`` of them (all, if fewer are kept)."""
    chosen = key[keep].to(torch.float64)
    n = int(chosen.numel())
    if n == 0:
        return keep
    vals = torch.sort(chosen, descending=True).values
    gain = torch.cat([torch.zeros(1, dtype=torch.float64, device=vals.device), vals.cumsum(0)])
    rows = batch + torch.arange(n + 1, device=vals.device)
    worth = gain - price.rate * price.seconds(rows)
    admissible = torch.ones(n + 1, dtype=torch.bool, device=vals.device)
    admissible[1:n] = vals[:-1] > vals[1:]  # a cut between two equal keys is not ancestor-safe
    admissible[: min(min_rows, n)] = False  # exploring: at least min_rows (n is always allowed)
    worth = torch.where(admissible, worth, -torch.inf)
    best = int(torch.argmax(worth))  # first maximum: the smaller cut among ties
    if best == n:
        return keep
    if best == 0:
        return torch.zeros_like(keep)
    return keep & (key.to(torch.float64) >= vals[best - 1])
