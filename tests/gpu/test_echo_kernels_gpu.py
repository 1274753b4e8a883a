"""echo-kernels on a real GPU at serving sizes: Triton kernels vs the torch references.

Geometry of Llama-3.1-8B (32 query / 8 KV heads, head dim 128) and SmolLM2-135M (9 / 3, 64),
contexts 512-8192, batches 1-256 with ragged trees of 1-64 nodes. Imports only torch, triton,
pytest and the ECHO packages (the device image has nothing else).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from echo_core.acceptance_stochastic import draw_uniforms
from echo_core.tree import TreeBatch, make_tree
from echo_core.verify_rows import node_rows, parent_rows
from echo_kernels import (
    ATTENTION_TOLERANCES,
    commit_kv,
    greedy_accept,
    prefill_metadata,
    stochastic_accept,
    tree_attention,
    verify_metadata,
)
from echo_kernels.testing import random_pool, random_rows, random_tree_of_sizes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")
LLAMA = ((32, 8), 128)
LLAMA_VOCAB = 128_256
SMOL = ((9, 3), 64)


def ragged_tree(batch: int, seed: int, max_nodes: int = 64) -> TreeBatch:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, max_nodes + 1, (batch,), generator=g).tolist()
    return random_tree_of_sizes(g, sizes).to(CUDA)


def compare_attention(
    tree: TreeBatch, cache_len: list[int], heads: tuple[int, int], head_dim: int,
    dtype: torch.dtype, window: int | None = None,
) -> None:  # fmt: skip
    g = torch.Generator(CUDA).manual_seed(0)
    r = tree.batch_size + tree.num_nodes
    pool = random_pool(g, cache_len, r, heads[1], head_dim, dtype)
    rows = random_rows(g, r, heads[0], heads[1], head_dim, dtype)
    meta = verify_metadata(tree, pool.cache_len, pool.req_to_slot)
    args = (rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta)
    got = tree_attention(*args, window=window)  # auto: Triton on CUDA
    want = tree_attention(*args, window=window, backend="torch")
    tol = ATTENTION_TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("batch", "max_ctx"), [(1, 8192), (16, 2048), (64, 4096), (256, 512)])
def test_llama8b_tree_attention(batch: int, max_ctx: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(batch)
    lens = torch.randint(max_ctx // 16, max_ctx + 1, (batch,), generator=g).tolist()
    compare_attention(ragged_tree(batch, batch), lens, *LLAMA, dtype)


def test_llama8b_large_batch_long_context_bf16() -> None:
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(4096, 8193, (256,), generator=g).tolist()
    compare_attention(ragged_tree(256, 7), lens, *LLAMA, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_smollm2_tree_attention_with_sliding_window(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 2049, (32,), generator=g).tolist()
    compare_attention(ragged_tree(32, 3), lens, *SMOL, dtype, window=512)


def test_prefill_matches_reference() -> None:
    counts, cached = [2048, 1, 700, 0, 129], [0, 4000, 300, 17, 1]
    g = torch.Generator(CUDA).manual_seed(1)
    pool = random_pool(g, cached, sum(counts), 8, 128, torch.bfloat16)
    rows = random_rows(g, sum(counts), 32, 8, 128, torch.bfloat16)
    meta = prefill_metadata(torch.tensor(counts, device=CUDA), pool.cache_len, pool.req_to_slot)
    args = (rows.q, rows.k_new, rows.v_new, pool.k_pool, pool.v_pool, meta)
    tol = ATTENTION_TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(
        tree_attention(*args).float(), tree_attention(*args, backend="torch").float(),
        atol=tol.atol, rtol=tol.rtol,
    )  # fmt: skip


def same(got: object, want: object) -> None:
    for name in ("accepted_nodes", "num_accepted", "bonus_token"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_greedy_acceptance_at_batch_256() -> None:
    tree = ragged_tree(256, 11)
    g = torch.Generator(CUDA).manual_seed(2)
    argmax = torch.randint(0, 2, (tree.batch_size + tree.num_nodes,), generator=g, device=CUDA)
    tree = TreeBatch(tree.cu_nodes, tree.token % 2, tree.parent, tree.depth,
                     tree.draft_logprob, tree.path_logprob)  # fmt: skip
    same(greedy_accept(tree, argmax), greedy_accept(tree, argmax, backend="torch"))


def top_k_probs(logits: Tensor, top_k: int) -> Tensor:
    """Softmax over the ``top_k`` largest logits of each row (as after top-k sampling)."""
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)


@pytest.mark.parametrize("kind", ["sampled", "deterministic"])
def test_stochastic_acceptance_at_batch_256_llama_vocab(kind: str) -> None:
    # Top-k targets: with full 128k-entry distributions the inverse-CDF bonus can legitimately
    # differ at float-rounding ties (each implementation sums the CDF in its own order).
    tree = ragged_tree(256, 12)
    vocab, r = LLAMA_VOCAB, tree.batch_size + tree.num_nodes
    g = torch.Generator(CUDA).manual_seed(3)
    logits = torch.randn(r, vocab, generator=g, device=CUDA) * 3
    target = top_k_probs(logits, 40)
    noise = torch.randn(r, vocab, generator=g, device=CUDA)  # a draft close to the target
    draft = top_k_probs(logits + noise, 40) if kind == "sampled" else None
    del logits, noise
    # Draft tokens from the parent row's support, so acceptances happen.
    source = target if draft is None else draft
    tokens = torch.multinomial(source[parent_rows(tree)], 1, generator=g).squeeze(1)
    tree = TreeBatch(tree.cu_nodes, tokens, tree.parent, tree.depth,
                     tree.draft_logprob, tree.path_logprob)  # fmt: skip
    sampled = torch.full((tree.num_nodes,), kind == "sampled", device=CUDA)
    u = draw_uniforms(tree, g)
    got = stochastic_accept(tree, target, sampled, draft, u)
    same(got, stochastic_accept(tree, target, sampled, draft, u, backend="torch"))
    assert int(got.num_accepted.sum()) > 0


def test_stochastic_kernel_reproduces_the_target_distribution() -> None:
    # 200k copies of one request: root with three sampled children, each with a child. The
    # first emitted token (first accepted node, else the bonus) must follow P[root] exactly.
    vocab, trials = 6, 200_000
    g = torch.Generator(CUDA).manual_seed(4)
    p_root = torch.tensor([0.35, 0.25, 0.15, 0.1, 0.1, 0.05], device=CUDA)
    q_root = torch.tensor([0.05, 0.1, 0.1, 0.15, 0.25, 0.35], device=CUDA)
    shape = make_tree([[(0, -1, -1.0), (0, -1, -1.0), (0, -1, -1.0), (0, 0, -1.0)]])
    n = shape.num_nodes
    tokens = torch.multinomial(q_root.expand(trials, vocab), 3, replacement=True, generator=g)
    tokens = torch.cat([tokens, torch.zeros(trials, 1, dtype=torch.int64, device=CUDA)], 1)
    tree = TreeBatch(
        cu_nodes=torch.arange(trials + 1, device=CUDA) * n, token=tokens.flatten(),
        parent=shape.parent.to(CUDA).repeat(trials), depth=shape.depth.to(CUDA).repeat(trials),
        draft_logprob=torch.zeros(trials * n, device=CUDA),
        path_logprob=torch.zeros(trials * n, device=CUDA),
    )  # fmt: skip
    r = trials * (n + 1)
    target = torch.softmax(torch.randn(r, vocab, generator=g, device=CUDA), dim=-1)
    draft = torch.softmax(torch.randn(r, vocab, generator=g, device=CUDA), dim=-1)
    roots = torch.arange(trials, device=CUDA) * (n + 1)
    target[roots], draft[roots] = p_root, q_root
    sampled = torch.ones(trials * n, dtype=torch.bool, device=CUDA)
    sampled[3::4] = False  # node 3, node 0's only child, is a deterministic candidate
    result = stochastic_accept(tree, target, sampled, draft, draw_uniforms(tree, g))
    first_node = result.accepted_nodes[:, 0].clamp(min=0) + tree.cu_nodes[:-1]
    first = torch.where(result.num_accepted > 0, tree.token[first_node], result.bonus_token)
    observed = torch.bincount(first, minlength=vocab).double()
    expected = p_root.double() * trials
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.52, (chi2, observed.tolist())  # chi-square, 5 dof, p = 0.001


def test_commit_at_batch_256() -> None:
    tree = ragged_tree(256, 13)
    g = torch.Generator(CUDA).manual_seed(5)
    r = tree.batch_size + tree.num_nodes
    argmax = torch.zeros(r, dtype=torch.int64, device=CUDA)
    argmax[parent_rows(tree)] = tree.token  # accept everything on the first path
    argmax[node_rows(tree)] = torch.randint(0, 100, (tree.num_nodes,), generator=g, device=CUDA)
    result = greedy_accept(tree, argmax)
    cache_len = torch.randint(0, 4000, (256,), generator=g, device=CUDA)
    table = torch.randint(0, 10**6, (300, 4200), generator=g, device=CUDA)  # a pool's table
    rows = torch.randperm(300, generator=g, device=CUDA)[:256]
    slots = torch.randperm(10**6, generator=g, device=CUDA)[:r]
    t1, t2 = table.clone(), table.clone()
    path = (result.accepted_nodes, result.num_accepted)
    a = commit_kv(t1, cache_len, slots, tree, *path, req_rows=rows)
    b = commit_kv(t2, cache_len, slots, tree, *path, req_rows=rows, backend="torch")
    assert torch.equal(t1, t2)
    assert torch.equal(a.cache_len, b.cache_len)
    assert torch.equal(a.free_slots, b.free_slots)
