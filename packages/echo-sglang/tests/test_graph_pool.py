"""The draft pool read back from SGLang's draft-decode CUDA graph (``echo_sglang.graph_pool``).

On the CPU a replay is what a CUDA graph replay does to the recorded tensors: new values written
in place into the same storage (``copy_``). Whether a real graph does that to the tensors seen at
capture, with several graphs sharing one memory pool, is ``test_graph_pool_gpu.py``. The worker
that wires this into SGLang imports SGLang's CUDA worker, so its contract with SGLang (which
method the graph runner captures, what ``execute`` sets, the variant rule) is checked on SGLang's
source here.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from echo_sglang.args import EchoArgs
from echo_sglang.config import EagleShape, resolve
from echo_sglang.graph_pool import DraftGraphPools, Replay, greedy_variant
from echo_sglang.pool_capture import capture_draft_pool, organize_hook
from echo_sglang.step import EchoStep
from echo_sglang.synthetic import EagleLists, eagle_draft

from .source_ast import WORKER, function_def

STEPS, TOPK, N = 3, 3, 8


def _captured(lists: EagleLists) -> EagleLists:
    """The lists as the AROUND hook records them inside the draft (the capture run)."""
    with capture_draft_pool() as captured:
        organize_hook(lambda *a: None, *lists, N)
    assert captured.lists is not None
    return captured.lists


def _replay_into(recorded: EagleLists, new: EagleLists) -> None:
    """Write ``new`` into the recorded storage; step 0's parents are an expanded constant
    (``arange(-1, k).expand(B, -1)``, as in SGLang's ``_select_top_k_tokens_first``)."""
    for rec_part, new_part in zip(recorded, new, strict=True):
        for rec, fresh in zip(rec_part, new_part, strict=True):
            if 0 in rec.stride():
                assert torch.equal(rec, fresh)
            else:
                rec.copy_(fresh)


def test_a_replay_is_read_back_for_the_real_rows_and_plans_like_the_eager_draft() -> None:
    gen = torch.Generator().manual_seed(3)
    pools = DraftGraphPools(rejection_sampling=False)
    recorded = _captured(eagle_draft(gen, 8, STEPS, TOPK, vocab=32))  # captured at B_pad = 8
    pools.record(recorded, all_greedy=False)
    pointers = [t.data_ptr() for part in recorded for t in part]

    new = eagle_draft(gen, 8, STEPS, TOPK, vocab=32)  # the next step, rows 5-7 padding
    _replay_into(recorded, new)
    read = pools.read(Replay(padded_bs=8, raw_bs=5, greedy_variant=False), batch_size=5)

    for got_part, new_part in zip(read, new, strict=True):
        for got, fresh in zip(got_part, new_part, strict=True):
            assert torch.equal(got, fresh[:5])
    assert [t.data_ptr() for part in read for t in part] == pointers  # views, no copies

    config = resolve(EchoArgs(budget=12), EagleShape(STEPS, TOPK, N))
    root, seq_lens = torch.arange(5) + 40, torch.tensor([3, 9, 0, 5, 2])
    scores, tokens, parents = ([t[:5].clone() for t in part] for part in new)
    _, from_graph = EchoStep(config).plan(*read, root, seq_lens)
    _, from_eager = EchoStep(config).plan(scores, tokens, parents, root, seq_lens)
    for name in ("draft_token", "positions", "retrive_index", "retrive_next_token"):
        assert torch.equal(getattr(from_graph, name), getattr(from_eager, name)), name


def test_graphs_of_each_size_and_variant_keep_their_own_pool() -> None:
    gen = torch.Generator().manual_seed(4)
    pools = DraftGraphPools(rejection_sampling=True)
    lists = {
        (bs, greedy): _captured(eagle_draft(gen, bs, STEPS, TOPK)) for bs in (2, 4)
        for greedy in (False, True)
    }  # fmt: skip
    for (_, greedy), captured in lists.items():
        pools.record(captured, all_greedy=greedy)
    assert len(pools) == 4
    for (bs, greedy), captured in lists.items():
        read = pools.read(Replay(bs, bs, greedy), batch_size=bs)
        assert read[0][0].data_ptr() == captured[0][0].data_ptr()
    # Without rejection sampling SGLang captures one graph per size, greedy batch or not.
    one = DraftGraphPools(rejection_sampling=False)
    one.record(lists[(2, False)], all_greedy=True)
    assert one.read(Replay(2, 2, greedy_variant(False, True)), 2)[1][0] is not None


def test_bad_replays_and_pools_are_refused_with_the_reason() -> None:
    gen = torch.Generator().manual_seed(5)
    pools = DraftGraphPools(rejection_sampling=False)
    pools.record(_captured(eagle_draft(gen, 4, STEPS, TOPK)), all_greedy=False)
    with pytest.raises(RuntimeError, match=r"no draft pool .* batch size 8.*recorded: \[\(4, "):
        pools.read(Replay(8, 8, False), 8)
    with pytest.raises(ValueError, match="cannot come from a graph padded to 4"):
        pools.read(Replay(4, 5, False), 5)
    with pytest.raises(RuntimeError, match="replayed 3 requests, the step has 2"):
        pools.read(Replay(4, 3, False), 2)
    scores, tokens, parents = eagle_draft(gen, 4, STEPS, TOPK)
    with pytest.raises(ValueError, match="one batch size"):
        pools.record((scores, [tokens[0][:2], *tokens[1:]], parents), all_greedy=False)
    with pytest.raises(ValueError, match="non-empty"):
        pools.record(([], tokens, parents), all_greedy=False)


class _Runner:
    """What ``EAGLEDraftCudaGraphRunner.execute`` leaves behind: ``bs`` and ``raw_bs``."""

    def __init__(self) -> None:
        self.bs = self.raw_bs = 0

    def execute(self, forward_batch: Any) -> str:
        self.raw_bs = forward_batch.batch_size
        self.bs = 1 << (self.raw_bs - 1).bit_length()  # padded to a power of two
        return "graph outputs"


def test_watch_notes_each_replay_once() -> None:
    pools = DraftGraphPools(rejection_sampling=True)
    runner = _Runner()
    execute = pools.watch(runner.execute, runner)
    assert pools.take_replay() is None
    greedy = SimpleNamespace(is_all_greedy=True)
    assert execute(SimpleNamespace(batch_size=3, sampling_info=greedy)) == "graph outputs"
    assert pools.take_replay() == Replay(padded_bs=4, raw_bs=3, greedy_variant=True)
    assert pools.take_replay() is None  # a later step that replayed nothing reads nothing
    execute(SimpleNamespace(batch_size=5, sampling_info=None))
    assert pools.take_replay() == Replay(8, 5, False)


def _calls(fn: ast.FunctionDef) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}


def _assigned(fn: ast.FunctionDef) -> set[str]:
    return {
        ast.unparse(t) for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets
    }  # fmt: skip


def test_the_worker_matches_sglangs_draft_graph_runner(sglang_site: Path) -> None:
    """What the worker relies on, on SGLang 0.5.23's source (the worker cannot import on CPU)."""
    spec = sglang_site / "sglang" / "srt" / "speculative"
    runner = spec / "eagle_draft_cuda_graph_runner.py"
    # The capture runs the draft worker's draft_forward (ECHO's override records the pool) ...
    assert "self.eagle_worker.draft_forward" in _calls(function_def(runner, "capture_one_shape"))
    # ... execute sets the padded and the real batch size before it returns ...
    assert {"self.raw_bs", "self.bs"} <= _assigned(function_def(runner, "execute"))
    # ... and the greedy variant is keyed on exactly the two flags greedy_variant takes.
    variant = ast.unparse(function_def(runner, "_sampling_variant"))
    assert "speculative_use_rejection_sampling" in variant
    assert "is_all_greedy" in variant
    # EAGLE's draft replays through the runner's execute, or calls draft_forward eagerly.
    draft = _calls(function_def(spec / "eagle_worker_v2.py", "draft"))
    assert {"self.cuda_graph_runner.execute", "self.draft_forward"} <= draft
    # And the worker overrides the three methods the plugin's path goes through.
    worker = ast.parse(WORKER.read_text(encoding="utf-8"))
    methods = {n.name for n in ast.walk(worker) if isinstance(n, ast.FunctionDef)}
    assert {"_capture_cuda_graphs", "draft_forward", "draft"} <= methods
