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


def exact_cut(
    key: Tensor,
    keep: Tensor,
    batch: int,
    price: RowPrice,
    min_rows: int = 0,
    gather: bool | None = None,
) -> Tensor:
    """``keep`` ([N] bool, ancestor-closed) cut to its ``k*`` best rows by ``key`` ([N]), at
    least ``min_rows`` of them (all, if fewer are kept).

    The candidates are the ``n`` kept keys in decreasing order. ``gather`` (default: on the
    CPU) takes them out of ``key``, which reads ``n`` on the host: free on the CPU, a stall on a
    GPU. Otherwise they are all N keys with the others at ``-inf``, ``W(k)`` is evaluated for
    every ``k <= N`` and the ones past ``n`` are inadmissible: fixed shape, no host sync (issue
    #44), the same cut."""
    if key.numel() == 0:
        return keep
    dev = key.device
    if key.device.type == "cpu" if gather is None else gather:
        vals = torch.sort(key[keep].to(torch.float64), descending=True).values
        n: Tensor | int = int(vals.numel())
        if n == 0:
            return keep
    else:
        masked = torch.where(keep, key.to(torch.float64), -torch.inf)
        vals, n = torch.sort(masked, descending=True).values, keep.sum()
    c = int(vals.numel())  # candidates: n, or N
    k = torch.arange(c + 1, device=dev)
    zero = torch.zeros(1, dtype=torch.float64, device=dev)
    gain = torch.cat([zero, torch.where(k[1:] <= n, vals, 0.0).cumsum(0)])  # G(k), k = 0..c
    worth = gain - price.rate * price.seconds(batch + k)
    step_down = torch.ones(c + 1, dtype=torch.bool, device=dev)
    step_down[1:c] = vals[:-1] > vals[1:]  # a cut between two equal keys is not ancestor-safe
    least = torch.clamp(torch.as_tensor(n, device=dev), max=min_rows)  # exploring: min(m, n)
    admissible = step_down & (k <= n) & (k >= least)
    best = torch.argmax(torch.where(admissible, worth, -torch.inf))  # first maximum: smaller cut
    threshold = torch.where(best > 0, vals[(best - 1).clamp(min=0)], torch.inf)
    return keep & (key.to(torch.float64) >= threshold)
