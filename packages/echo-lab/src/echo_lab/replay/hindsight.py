"""Cost-aware hindsight efficiency (eta): a policy's throughput over a hindsight oracle's.

The oracle sees every step's reference pool (the full recorded pool) with the target's
continuation, so it knows each request's reachable accepted length ``L_b`` (capped at
``max_nodes[b]``). It verifies only accepted nodes, drafted as one chain per request, shallowest
first across the batch, so ``k`` accepted tokens cost

    calls(k) = min { c : sum_b min(L_b, c) >= k },   expansions(k) = k,
    t(k) = t_draft(B, calls(k), k) + t_verify(B, B + k),   tokens(k) = B + k

and it chooses ``k_i`` per step to maximise the *run's* throughput ``sum_i tokens_i / sum_i t_i``
(not each step's own ratio): by Dinkelbach's method, for a rate ``lam`` each step independently
maximises ``tokens(k) - lam t(k)``, then ``lam`` becomes the resulting run rate, until it stops
rising. Any policy replayed on the same steps emits ``B + a`` tokens with ``a`` accepted nodes
from the same pool, at least ``calls(a)`` drafter calls, at least ``a`` expansions (each accepted
node's parent) and at least ``a`` verified rows, so under a cost model monotone in each argument
its run rate never exceeds the oracle's: ``eta <= 1``.

Decomposition: ``eta = token_share * time_share`` with ``token_share = sum tokens / sum oracle
tokens`` and ``time_share = sum oracle seconds / sum seconds``. Diagnostics beside it:
``coverage`` = accepted nodes reachable in the policy's own pool / in the reference pool (what
its drafting left reachable), ``selection`` = accepted / the best accepted from its own pool with
as many verified rows (selection quality at its own spend) and ``row_yield`` = accepted /
verified (the share of paid rows that paid back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_lab.replay.costs import StepCost
from echo_scheduler.errors import CostModelError

MAX_ITERATIONS = 100


@dataclass(frozen=True, slots=True)
class OracleRun:
    tokens: float  # sum over steps of B + k_i
    seconds: float
    accepted: Tensor  # [S] int64, k_i
    calls: Tensor  # [S] int64

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def step_options(reach: Tensor, cost: StepCost) -> tuple[Tensor, Tensor, Tensor]:
    """For one step with capped reach ``L`` ([B] int64): per k = 0..sum L, the oracle's tokens,
    seconds and drafter calls ([sum L + 1] float64, float64, int64)."""
    b = int(reach.numel())
    top = int(reach.max()) if b else 0
    depths = torch.arange(top + 1, dtype=reach.dtype, device=reach.device)
    covered = torch.minimum(reach[None, :], depths[:, None]).sum(dim=1)  # A(c), c = 0..top
    k = torch.arange(int(covered[-1]) + 1 if b else 1)
    calls = torch.searchsorted(covered.contiguous(), k, right=False)  # smallest c: A(c) >= k
    seconds = torch.tensor(
        [
            cost.draft_s(b, int(c), int(n)) + cost.verify_s(b, b + int(n))
            for c, n in zip(calls.tolist(), k.tolist(), strict=True)
        ],
        dtype=torch.float64,
    )
    return (b + k).to(torch.float64), seconds, calls


def oracle_run(reaches: Sequence[Tensor], cost: StepCost) -> OracleRun:
    """The run-rate-optimal hindsight choice of k per step (module docstring)."""
    options = [step_options(r, cost) for r in reaches]

    def totals(picks: list[int]) -> tuple[float, float]:
        tokens = sum(float(o[0][p]) for o, p in zip(options, picks, strict=True))
        seconds = sum(float(o[1][p]) for o, p in zip(options, picks, strict=True))
        return tokens, seconds

    best = [0] * len(options)  # start from plain decoding
    tokens, seconds = totals(best)
    rate = tokens / seconds if seconds > 0 else 0.0
    for _ in range(MAX_ITERATIONS):
        picks = [int(torch.argmax(o[0] - rate * o[1])) for o in options]
        t, s = totals(picks)
        new_rate = t / s if s > 0 else 0.0
        if new_rate <= rate * (1 + 1e-12):
            break
        best, tokens, seconds, rate = picks, t, s, new_rate
    else:  # Dinkelbach converges superlinearly: this means a cost model it cannot handle
        raise CostModelError(f"the hindsight oracle did not converge in {MAX_ITERATIONS} rounds")
    calls = torch.tensor(
        [int(o[2][p]) for o, p in zip(options, best, strict=True)], dtype=torch.int64
    )
    return OracleRun(tokens, seconds, torch.tensor(best, dtype=torch.int64), calls)
