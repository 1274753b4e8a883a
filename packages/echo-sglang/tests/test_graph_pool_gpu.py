"""GPU tier: the premise of ``echo_sglang.graph_pool`` on real CUDA graphs.

The tensors a draft loop hands to ``organize_draft_results`` while a CUDA graph is captured hold
each replay's values afterwards, also when several graphs (one per padded batch size, captured
largest first, as SGLang does) share one memory pool. The draft loop here has EAGLE's structure
(step 0: the root's top-k; step i: the ``k x k`` children of the frontier scored by path
probability, the best ``k`` expanded) with random draft logits as its static input, so every
step's pool can be recomputed eagerly and compared.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from echo_sglang.graph_pool import DraftGraphPools, Replay, stream_capturing
from echo_sglang.pool_capture import capture_draft_pool, organize_hook

pytestmark = pytest.mark.gpu

STEPS, TOPK, N, VOCAB, MAX_BS = 4, 4, 16, 512, 16
SIZES = (16, 8, 4)  # SGLang captures the largest batch first


def _organize(scores: list[Tensor], tokens: list[Tensor], parents: list[Tensor], n: int) -> Tensor:
    """Stands in for SGLang's organize_draft_results (the hook only records its inputs)."""
    return torch.topk(torch.cat([s.flatten(1) for s in scores], dim=1), n - 1, dim=-1).indices


def _draft(topk_p: Tensor, topk_index: Tensor, child_logits: Tensor) -> Tensor:
    """EAGLE's draft loop over static inputs; the pool goes through the AROUND hook."""
    bs = topk_p.shape[0]
    scores = [topk_p.unsqueeze(1)]
    tokens = [topk_index]
    parents = [torch.arange(-1, TOPK, device=topk_p.device).expand(bs, -1)]
    frontier = topk_p
    for i in range(1, STEPS):
        cp, ctok = torch.topk(torch.softmax(child_logits[i - 1, : bs * TOPK], dim=-1), TOPK)
        expand = frontier.unsqueeze(2) * cp.view(bs, TOPK, TOPK)
        best = torch.topk(expand.flatten(1), TOPK, dim=-1)
        scores.append(expand)
        tokens.append(ctok.view(bs, TOPK * TOPK))
        parents.append(best.indices + TOPK * TOPK * (i - 1) + TOPK)
        frontier = best.values
    out: Tensor = organize_hook(_organize, scores, tokens, parents, N)
    return out


def _fill(gen: torch.Generator, topk_p: Tensor, topk_index: Tensor, logits: Tensor, n: int) -> None:
    """A new step's inputs for ``n`` real rows; the padding rows are zeroed (as SGLang does)."""
    root = torch.softmax(torch.randn(MAX_BS, VOCAB, generator=gen, device="cuda") * 3, dim=-1)
    p, idx = torch.topk(root, TOPK)
    for buf in (topk_p, topk_index, logits):
        buf.zero_()
    topk_p[:n].copy_(p[:n])
    topk_index[:n].copy_(idx[:n])
    logits[:, : n * TOPK].copy_(
        torch.randn(STEPS - 1, n * TOPK, VOCAB, generator=gen, device="cuda") * 3
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pools_recorded_at_capture_hold_every_replays_pool() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    topk_p = torch.zeros(MAX_BS, TOPK, device=dev)
    topk_index = torch.zeros(MAX_BS, TOPK, dtype=torch.int64, device=dev)
    logits = torch.zeros(STEPS - 1, MAX_BS * TOPK, VOCAB, device=dev)
    _fill(gen, topk_p, topk_index, logits, MAX_BS)

    pools = DraftGraphPools(rejection_sampling=False)
    memory_pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    for bs in SIZES:
        args = (topk_p[:bs], topk_index[:bs], logits)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the capture, as SGLang's backend does
                _draft(*args)
        torch.cuda.current_stream().wait_stream(side)
        assert not stream_capturing()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=memory_pool):
            assert stream_capturing()
            with capture_draft_pool() as captured:
                _draft(*args)
            assert captured.lists is not None
            pools.record(captured.lists, all_greedy=False)
        graphs[bs] = graph
    assert len(pools) == len(SIZES)

    for step, (bs, raw) in enumerate([(16, 16), (8, 5), (4, 4), (16, 11), (4, 3), (8, 8)]):
        _fill(gen, topk_p, topk_index, logits, raw)
        graphs[bs].replay()
        read = pools.read(Replay(bs, raw, greedy_variant=False), raw)
        with capture_draft_pool() as eager:
            _draft(topk_p[:bs], topk_index[:bs], logits)
        assert eager.lists is not None
        for got_part, want_part in zip(read, eager.lists, strict=True):
            for got, want in zip(got_part, want_part, strict=True):
                assert torch.equal(got, want[:raw]), f"step {step}, graph {bs}"
