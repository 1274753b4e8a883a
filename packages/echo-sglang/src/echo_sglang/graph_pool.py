"""EAGLE's draft pool read back from SGLang's draft-decode CUDA graph, so the graph is kept.

SGLang runs EAGLE's draft loop (``draft_forward``, ``organize_draft_results`` included) as one CUDA
graph per padded batch size ``B_pad``. A replay re-runs the captured kernels on the captured
addresses, so the score, token and parent tensors handed to ``organize_draft_results`` during the
*captured* run are static buffers: after every replay they hold that step's pool for ``B_pad``
rows, of which the first ``B_raw`` are real requests (the rest is SGLang's padding).

:class:`DraftGraphPools` keeps those tensors, one set per graph key ``(B_pad, greedy_variant)``
(SGLang captures a second, greedy-only variant per size under rejection sampling), and hands the
worker ``t[:B_raw]`` of each after a replay. :meth:`DraftGraphPools.watch` wraps the graph
runner's ``execute`` to note which graph just replayed (``runner.bs``, ``runner.raw_bs``, set by
SGLang inside ``execute``); :meth:`DraftGraphPools.take_replay` returns that note once, so a step
that replayed nothing can never read an older step's pool.

Lifetime. The references keep the tensors' blocks out of every later capture in SGLang's shared
graph memory pool. A graph captured *earlier* may still write, when it replays, into blocks it
freed at its own capture, and these tensors may live in such blocks (SGLang met exactly this with
``draft_probs``). So the pool is valid from this graph's replay until the next replay of another
graph: the worker reads it at once, and ``EchoStep.plan`` concatenates it into fresh tensors
(:func:`~echo_sglang.eagle_pool.concat_draft_lists`) before the target's verify graph runs.

Nothing here imports sglang.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

DraftLists = tuple[list[Tensor], list[Tensor], list[Tensor]]
"""``(score_list, token_list, parents_list)``, one tensor per draft step, batch first."""


def stream_capturing() -> bool:
    """True inside a CUDA graph capture on the current stream (False on a CPU-only torch)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def greedy_variant(rejection_sampling: bool, all_greedy: bool) -> bool:
    """Whether SGLang replays (or captured) the greedy-only graph variant.

    The same rule as SGLang 0.5.23's ``EAGLEDraftCudaGraphRunner._sampling_variant``: only under
    ``--speculative-use-rejection-sampling``, for an all-greedy batch. A copy, because the capture
    side runs before the runner exists; ECHO refuses rejection sampling today (``spec_algo.py``),
    so only the non-greedy key is ever used, and a contract test reads SGLang's rule.
    """
    return rejection_sampling and all_greedy


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay of the draft graph: padded and real batch size, and its variant."""

    padded_bs: int
    raw_bs: int
    greedy_variant: bool


class DraftGraphPools:
    """The draft pool of every captured draft-decode graph (module docstring)."""

    def __init__(self, *, rejection_sampling: bool) -> None:
        self.rejection_sampling = rejection_sampling
        self._pools: dict[tuple[int, bool], DraftLists] = {}
        self._last: Replay | None = None

    def __len__(self) -> int:
        return len(self._pools)

    def record(self, lists: DraftLists, *, all_greedy: bool) -> None:
        """Keep the pool of the run being captured (a later capture of the same key replaces it)."""
        key = (_batch_size(lists), greedy_variant(self.rejection_sampling, all_greedy))
        self._pools[key] = lists

    def watch(self, execute: Callable[[Any], Any], runner: Any) -> Callable[[Any], Any]:
        """``runner.execute`` that also notes which graph it replayed."""

        def execute_and_note(forward_batch: Any) -> Any:
            out = execute(forward_batch)
            all_greedy = forward_batch.sampling_info is not None and bool(
                forward_batch.sampling_info.is_all_greedy
            )
            self._last = Replay(
                int(runner.bs),
                int(runner.raw_bs),
                greedy_variant(self.rejection_sampling, all_greedy),
            )
            return out

        return execute_and_note

    def take_replay(self) -> Replay | None:
        """The replay noted since the last call, if any (then forgotten)."""
        last, self._last = self._last, None
        return last

    def read(self, replay: Replay, batch_size: int) -> DraftLists:
        """The first ``batch_size`` rows of the pool ``replay`` just wrote (views, not copies).

        ``batch_size`` is the step's own request count; it must equal the replay's ``raw_bs``.
        """
        if replay.raw_bs != batch_size:
            raise RuntimeError(
                f"the draft graph replayed {replay.raw_bs} requests, the step has {batch_size}"
            )
        key = (replay.padded_bs, replay.greedy_variant)
        lists = self._pools.get(key)
        if lists is None:
            raise RuntimeError(
                f"ECHO recorded no draft pool for the draft-decode CUDA graph of batch size "
                f"{replay.padded_bs} (greedy variant: {replay.greedy_variant}); recorded: "
                f"{sorted(self._pools)}. The graph was captured without ECHO's draft_forward."
            )
        if not 0 < replay.raw_bs <= replay.padded_bs:
            raise ValueError(
                f"a replay of {replay.raw_bs} requests cannot come from a graph padded to "
                f"{replay.padded_bs}"
            )
        n = replay.raw_bs
        scores, tokens, parents = lists
        return [t[:n] for t in scores], [t[:n] for t in tokens], [t[:n] for t in parents]


def _batch_size(lists: DraftLists) -> int:
    sizes = {t.shape[0] for part in lists for t in part}
    if len(sizes) != 1 or not all(lists):
        raise ValueError(
            f"a draft pool needs non-empty score/token/parent lists of one batch size, got "
            f"lengths {[len(p) for p in lists]} and batch sizes {sorted(sizes)}"
        )
    return sizes.pop()
