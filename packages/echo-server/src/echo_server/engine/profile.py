"""The start-up verify-cost profile: timing the target's verify pass on this machine.

Times one target verify pass over ``T`` tokens for a few ``T`` (a single request with a chain of
``T - 1`` draft rows after a short cached prefix, the model's real forward), in interleaved
rounds. Checking, caching and re-measuring a profile is :mod:`echo_server.engine.profile_store`'s;
what the budget makes of it (the knee's K, the elastic floor) is :mod:`echo_server.engine.budget`'s
and echo-scheduler's (:mod:`echo_scheduler.budget`); the live correction is
:mod:`echo_server.engine.cost_feedback`'s.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import structlog
import torch

from echo_core.tree import make_tree
from echo_scheduler.errors import CostModelError
from echo_server.kv.pool import KVPool
from echo_server.model.attention import tree_row_mask
from echo_server.model.llama import LlamaModel

log = structlog.get_logger(__name__)

PROFILE_TOKENS = (*range(1, 9), 10, 12, 16, 24, 32, 48, 64, 96)
"""Verify-pass sizes the profile times: every count up to 8, where a CPU's cost is a staircase
(on the AMD EPYC VM 1-6 rows within 6% of one another, the seventh +20%:
docs/lab/2026-12-04.md), then sparser; the profile extends its last slope past 96."""
PROFILE_ROUNDS = 5
"""Interleaved rounds of the start-up profile (:func:`measure_profile_rounds`)."""
PREFIX = 64
REPEATS = 3
DEFAULT_CACHE = Path.home() / ".cache" / "echo" / "verify_cost"


def measure_profile_rounds(
    model: LlamaModel, tokens: tuple[int, ...] = PROFILE_TOKENS, rounds: int = 9
) -> list[float]:
    """Median seconds of one verify pass over each T in ``tokens``, timed in ``rounds`` interleaved
    rounds (one request, a cached prefix of ``PREFIX`` tokens, a chain of ``T - 1`` draft rows):
    each round times one pass per T, the T's order rotated by one every round. Timing the T's one
    after another (the start-up profile until 2026-12-04) turns the machine's drift between
    them into slope: on the AMD EPYC VM the cached profile's 8 -> 16 token slope was 3.8 ms per
    token against 2.1 [1.9, 2.4] measured interleaved (docs/BENCHMARKS.md, 2026-12-03/04)."""
    if rounds < 1 or not tokens or min(tokens) < 1:
        raise CostModelError(f"need rounds >= 1 and token counts >= 1, got {rounds}, {tokens}")
    rig = _VerifyRig(model, 1, PREFIX, max(tokens))
    order = list(tokens)
    times: dict[int, list[float]] = {t: [] for t in order}
    for t in order:  # warm-up
        rig.seconds(t - 1)
    for r in range(rounds):
        k = r % len(order)
        for t in order[k:] + order[:k]:
            times[t].append(rig.seconds(t - 1))
    return [sorted(times[t])[rounds // 2] for t in tokens]


def time_verify(
    model: LlamaModel, batch: int, draft_rows: int, context: int, repeats: int = REPEATS
) -> float:
    """Median seconds of the target's verify forward + logits over ``batch`` requests, each a
    cached context of ``context`` tokens and a chain of ``draft_rows`` draft rows (``batch *
    (1 + draft_rows)`` rows), after one warm-up pass."""
    rig = _VerifyRig(model, batch, context, draft_rows + 1)
    times = [rig.seconds(draft_rows) for _ in range(repeats + 1)]
    return sorted(times[1:])[repeats // 2]


class _VerifyRig:
    """``batch`` requests with a prefilled context of ``context`` tokens each (room for up to
    ``rows_each`` verify rows per request), whose verify passes can be timed again and again."""

    def __init__(self, model: LlamaModel, batch: int, context: int, rows_each: int) -> None:
        self.model, self.batch, self.context = model, batch, context
        self.pool = pool = KVPool(
            model.config,
            batch * (context + rows_each + 8),
            max_requests=batch,
            dtype=model.dtype,
            device=model.device,
        )
        self.handles = [pool.add_request() for _ in range(batch)]
        g = torch.Generator().manual_seed(0)
        for h in self.handles:  # prefill each context (its K/V is what the verify rows attend to)
            slots = pool.allocate(context)
            ids = torch.randint(0, model.config.vocab_size, (context,), generator=g)
            prefill = pool.attention_batch([h], [context], slots)
            dev = model.device
            model.forward(ids.to(dev), torch.arange(context, device=dev), prefill, pool.storage)
            pool.append([h], slots, [context])

    def seconds(self, draft_rows: int) -> float:
        """Seconds of one verify forward + logits, every request verifying its root and a chain
        of ``draft_rows`` draft rows (K/V written to fresh slots, then freed)."""
        model, pool, batch, dev = self.model, self.pool, self.batch, self.model.device
        rows_each = draft_rows + 1
        chains = make_tree([[(1, i - 1, -0.1) for i in range(draft_rows)] for _ in range(batch)])
        n = batch * rows_each
        ids = torch.full((n,), 2, dtype=torch.int64, device=dev)
        pos = (self.context + torch.arange(rows_each, device=dev)).repeat(batch)
        write = pool.allocate(n)
        verify = pool.attention_batch(
            self.handles, [rows_each] * batch, write, tree_row_mask(chains)
        )
        start = time.perf_counter()
        hidden = model.forward(ids, pos, verify, pool.storage).hidden
        model.logits(hidden)
        seconds = time.perf_counter() - start
        pool.free(write)
        return seconds


PROFILE_VERSION = 4
"""Part of the profile cache key: bumped when the forward's code path changes its cost (2: the
grouped-query CPU attention of 2026-12-02; 3: few-row projections padded, 2026-12-04) or the
profile's points or timing do (4: every count up to 8, interleaved rounds), so a profile cached
by older code is re-measured."""


def _cache_key(model: LlamaModel) -> str:
    cfg = model.config
    packed = model.lm_head.packed is not None  # the matmul path changes the profile's shape
    ident = f"{cfg}|{model.dtype}|{model.device}|{torch.get_num_threads()}|packed={packed}"
    # Padded or not changes the shape (1-2 rows as 4); which of 3-5 rows a load pads varies
    # with timing noise inside PAD_MARGIN, so it is not part of the key (one profile, not many).
    ident += f"|padded={any(p.pad_to for p in model.row_paths.values())}"
    ident += f"|v{PROFILE_VERSION}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]
