"""The exact per-step cut: how many of a policy's selected rows are worth verifying.

With the selected nodes' keys ``u`` (estimated acceptances, non-increasing along every path)
sorted in decreasing order, verifying the best k rows earns ``G(k) = u_(1) + ... + u_(k)``
expected tokens and takes ``t(B + k)`` seconds. At run rate ``lam`` (tokens per second) the
step's net worth is

    W(k) = G(k) - lam t(B + k),   k* = argmax_{0 <= k <= n} W(k)

(Dinkelbach's step towards the best run rate ``sum tokens / sum seconds``; exact for any shape of
``t``, concave at a CPU's start or a hinge past a GPU's knee, where a per-row floor from an
average slope is not). ``k* = 0`` is plain decoding. Only cuts between distinct key values are
admissible, so the kept set ``{u >= u_(k*)}`` stays ancestor-closed (a parent's key is at least
its child's).

:func:`best_rows` is the exploration of a cost model that has not timed a row count
(engine/cost_feedback.py): the best ``m`` rows whatever their price, so that the verify pass
times ``B + m`` rows, whether the prices refuse every row (a profile too dear) or pay for many
more (one too cheap).

Worked example: B = 2, keys (0.9, 0.5, 0.05), ``t(2..5)`` = 10, 10, 11, 12 ms, lam = 100
tokens/s: ``W(0..3)`` = 0 - 1.0, 0.9 - 1.0, 1.4 - 1.1, 1.45 - 1.2 = -1.0, -0.1, 0.3, 0.25: keep
the two best rows (the third earns 0.05 tokens for 1 ms, worth 0.1 at 100 tokens/s).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import RowPrice
from echo_scheduler.ranking import first_in_order, key_order


@dataclass(frozen=True, slots=True)
class RowBuffers:
    """A row price's numbers in device tensors (a captured step's buffers, refilled per step):
    ``rate`` (lam) and ``scale`` 0-dim float64, ``latency`` [T_max + 1] float64 with
    ``latency[T]`` the price's latency model at T (:meth:`RowPrice.latency_table`). A cut that
    reads them runs the same ops whatever the rate, the scale or the model."""

    rate: Tensor
    scale: Tensor
    latency: Tensor


def exact_cut(
    key: Tensor,
    keep: Tensor,
    batch: int,
    price: RowPrice,
    gather: bool | None = None,
    buffers: RowBuffers | None = None,
    limit: int | None = None,
) -> Tensor:
    """``keep`` ([N] bool, ancestor-closed) cut to its ``k*`` best rows by ``key`` ([N]).

    The candidates are the ``n`` kept keys in decreasing order. ``gather`` (default: on the
    CPU) takes them out of ``key``, which reads ``n`` on the host: free on the CPU, a stall on a
    GPU. Otherwise they are all N keys with the others at ``-inf``, ``W(k)`` is evaluated for
    every ``k <= N`` and the ones past ``n`` are inadmissible: fixed shape, no host sync (issue
    #44), the same cut. ``buffers``: ``price``'s numbers in a captured step's own device buffers
    (:class:`RowBuffers`), read in place of its floats and its latency model; the same float64
    operations and values. ``limit`` (without ``gather``): a static bound on how many ``keep``
    holds (the caller's guarantee, not checked), so the candidates are the ``min(limit, N)``
    best keys (a top-k, not a sort of all N), the same cut."""
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
        if limit is None:
            vals = torch.sort(masked, descending=True).values
        else:
            vals = torch.topk(masked, max(1, min(limit, masked.numel()))).values
        n = keep.sum()
    c = int(vals.numel())  # candidates: n, or N
    k = torch.arange(c + 1, device=dev)
    zero = torch.zeros(1, dtype=torch.float64, device=dev)
    gain = torch.cat([zero, torch.where(k[1:] <= n, vals, 0.0).cumsum(0)])  # G(k), k = 0..c
    if buffers is None:
        worth = gain - price.rate * price.seconds(batch + k)
    else:
        if batch + c >= buffers.latency.numel():
            raise PolicyError(
                f"the latency table covers T <= {buffers.latency.numel() - 1}, the cut needs "
                f"T <= {batch + c}"
            )
        worth = gain - buffers.rate * price.seconds(batch + k, buffers.scale, buffers.latency)
    step_down = torch.ones(c + 1, dtype=torch.bool, device=dev)
    step_down[1:c] = vals[:-1] > vals[1:]  # a cut between two equal keys is not ancestor-safe
    admissible = step_down & (k <= n)
    best = torch.argmax(torch.where(admissible, worth, -torch.inf))  # first maximum: smaller cut
    last_kept = vals.gather(0, (best - 1).clamp(min=0).view(1)).squeeze(0)  # no item() read
    threshold = torch.where(best > 0, last_kept, torch.inf)
    return keep & (key.to(torch.float64) >= threshold)


def best_rows(key: Tensor, keep: Tensor, rows: int, tiebreak: Tensor | None = None) -> Tensor:
    """``keep`` ([N] bool, ancestor-closed) cut to its first ``rows`` nodes in
    :func:`~echo_scheduler.ranking.key_order` (``key`` descending, then ``tiebreak``, then
    index), whatever their price; all of them if fewer are kept. With a key and a tiebreak that
    never rise from parent to child (a path score) that order lists parents first, so the set
    stays ancestor-closed. Fixed shape, no host sync: :func:`~echo_scheduler.ranking.
    first_in_order` with one group."""
    if rows <= 0 or key.numel() == 0:
        return torch.zeros_like(keep)
    one = torch.zeros_like(key, dtype=torch.int64)
    cap = torch.full((1,), rows, dtype=torch.int64, device=key.device)
    return first_in_order(key_order(key, tiebreak), one, cap, rows, keep)
