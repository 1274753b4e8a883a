"""Selection quality of a real step: the hindsight-best use of the rows it paid for.

Once a request has finished, its whole output is known, so for every step it took we know the
*continuation*: the tokens that followed the step's root, ``t_1 .. t_D``. Under greedy
acceptance a drafted node at depth d is accepted iff its parent is (or is the root) and its
token is ``t_d`` (:func:`echo_scheduler.outcome.accepted_mask`), so the pool's longest matching
path ``L_b`` is the most that request b could have gained from what was drafted. Every matching
node is worth one token and every other node nothing, so the best selection of as many rows as
the step verified, ``N`` (at most ``max_nodes[b]`` per request), accepts

    best = min(N, sum_b min(L_b, max_nodes[b]))

tokens (:func:`echo_scheduler.outcome.oracle_accepted` with ``N`` as the budget). A run's
``selection`` is ``sum realised accepted / sum best`` over its steps (not a mean of per-step
ratios): 1.0 means every row it paid for went to a node on the continuation's path, given what
it drafted. It is the replay's ``selection`` (echo_lab.replay.hindsight) on a real run.

It is a diagnostic, not a bound on speed. Measuring against the budget K instead (the bench's
old ``oracle_ratio``) credited a policy that verifies few rows: chain scored 1.0, EAGLE-2 0.4
and ECHO about 0.2, the reverse of their speed at concurrency 16. The cost-aware bound is the
replay's ``eta`` (``echo-sd sim``).

Worked example: two requests, pools matching ``L = (2, 3)``, caps ``(5, 1)``; a selection that
verified three nodes of request 0 (two matching) and none of request 1 has ``N = 3``, best
``min(3, 2 + 1) = 3``, realises 2: selection 2/3.

With temperature > 0 the continuation is the sampled output, and a node is accepted iff it
matches it (candidates rejected by the stochastic rule leave residual mass zero on their token),
so the same definition holds: the best the selection could have done given what was sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_lab.sim.rows import NO_TOKEN
from echo_scheduler.outcome import accepted_mask, oracle_accepted


def continuations(sequences: Sequence[Sequence[int]], roots: Sequence[int], depth: int) -> Tensor:
    """[B, depth] int64: ``sequences[b][roots[b] + 1 : roots[b] + 1 + depth]``, padded with
    :data:`NO_TOKEN` (``sequences[b]`` is request b's prompt + final output, ``roots[b]`` the
    index of the step's root in it)."""
    if len(sequences) != len(roots):
        raise ValueError(f"{len(sequences)} sequences for {len(roots)} roots")
    out = torch.full((len(roots), max(depth, 0)), NO_TOKEN, dtype=torch.int64)
    for b, (seq, root) in enumerate(zip(sequences, roots, strict=True)):
        if not 0 <= root < len(seq):
            raise ValueError(f"root index {root} outside a sequence of {len(seq)} tokens")
        tail = list(seq[root + 1 : root + 1 + depth])
        if tail:
            out[b, : len(tail)] = torch.tensor(tail, dtype=torch.int64)
    return out


@dataclass(frozen=True, slots=True)
class StepOracle:
    """Hindsight view of one step."""

    hit: Tensor  # [pool nodes] bool, nodes on the continuation's path
    reachable: Tensor  # [B] int64, L_b: longest matching path in the pool
    realised: Tensor  # [B] int64, matching nodes among the verified ones
    best: int  # min(N verified, sum_b min(L_b, max_nodes[b]))


def step_oracle(pool: TreeBatch, keep: Tensor, target: Tensor, max_nodes: Tensor) -> StepOracle:
    """The hindsight view of one step (module docstring). ``keep``: [pool nodes] bool, the
    verified nodes; ``target``: [B, D] int64; ``max_nodes``: [B] int64."""
    if keep.shape != (pool.num_nodes,) or target.shape[0] != pool.batch_size:
        raise ValueError(
            f"keep {tuple(keep.shape)} / target {tuple(target.shape)} do not fit a pool of "
            f"{pool.num_nodes} nodes over {pool.batch_size} requests"
        )
    if pool.num_nodes == 0:
        zero = torch.zeros(pool.batch_size, dtype=torch.int64)
        return StepOracle(torch.zeros(0, dtype=torch.bool), zero, zero.clone(), 0)
    hit = accepted_mask(pool, target)
    req = pool.request_index()
    reach = torch.bincount(req[hit], minlength=pool.batch_size)
    realised = torch.bincount(req[hit & keep], minlength=pool.batch_size)
    return StepOracle(hit, reach, realised, oracle_accepted(reach, max_nodes, int(keep.sum())))
