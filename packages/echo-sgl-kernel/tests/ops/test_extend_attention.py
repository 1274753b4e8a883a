"""extend_attention_cpu against the dense float64 reference, called as SGLang's intel_amx backend
calls it, for prefill with and without a cached prefix and for tree-masked speculative verify."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)
from sgl_kernel.extend_attention import tree_mask_blocks

from .attention_reference import PagedPool, attention_scale, make_pool, reference_attention
from .tolerance import assert_close

OPS = torch.ops.sgl_kernel
DTYPES = [torch.float32, torch.bfloat16]
HQ, HKV, D, DV = 6, 3, 20, 12
SCALE = D**-0.5


def _starts(extend: list[int]) -> list[int]:
    return [sum(extend[:i]) for i in range(len(extend))]


def _extend(
    pool: PagedPool,
    q: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    seq_lens: list[int],
    extend: list[int],
    *,
    k_scale: float = 1.0,
    logit_cap: float = 0.0,
    window: int = 0,
    encoder_lens: torch.Tensor | None = None,
    is_cross_attention: bool = False,
    sinks: torch.Tensor | None = None,
    tree_mask: torch.Tensor | None = None,
    is_causal: bool = True,
) -> torch.Tensor:
    out = q.new_full((q.shape[0], HQ, DV), float("nan"))
    OPS.extend_attention_cpu(
        q,
        k_new,
        v_new,
        out,
        pool.k_buffer,
        pool.v_buffer,
        k_scale,
        1.0,
        pool.req_to_token,
        pool.req_pool_indices,
        torch.tensor(seq_lens, dtype=torch.int64),
        torch.tensor(extend, dtype=torch.int32),
        torch.tensor(_starts(extend), dtype=torch.int32),
        max(extend),
        SCALE,
        logit_cap,
        is_cross_attention,
        window,
        encoder_lens,
        sinks,
        tree_mask,
        is_causal,
    )
    return out


def _batch(
    prefix: list[int], extend: list[int], dtype: torch.dtype, seed: int
) -> tuple[PagedPool, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool holding every token's K/V (SGLang stores the new ones before the call), and the
    new tokens' q, k, v packed in request order."""
    lens = [p + e for p, e in zip(prefix, extend, strict=True)]
    pool = make_pool(lens, HKV, D, DV, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(extend), HQ, D, generator=gen).to(dtype)
    new = torch.cat(
        [pool.slots(i, p, p + e) for i, (p, e) in enumerate(zip(prefix, extend, strict=True))]
    )
    return pool, q, pool.k_buffer[new].clone(), pool.v_buffer[new].clone()


def _check(
    out: torch.Tensor,
    pool: PagedPool,
    q: torch.Tensor,
    prefix: list[int],
    extend: list[int],
    visible_of: Callable[[int, int, int], torch.Tensor],
    dtype: torch.dtype,
    *,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> None:
    """Compare every request's rows; visible_of(i, p, e) gives its [e, p + e] mask."""
    for i, (p, e) in enumerate(zip(prefix, extend, strict=True)):
        if e == 0:
            continue
        q0 = _starts(extend)[i]
        slots = pool.slots(i, 0, p + e)
        values = pool.v_buffer[slots]
        ref = reference_attention(
            q[q0 : q0 + e],
            pool.k_buffer[slots],
            values,
            visible_of(i, p, e),
            SCALE,
            logit_cap,
            sinks,
        )
        scale = attention_scale(values)
        assert_close(out[q0 : q0 + e], ref, dtype, max(D, p + e), scale=scale)


def _causal(i: int, p: int, e: int) -> torch.Tensor:
    return torch.tensor([[n <= p + j for n in range(p + e)] for j in range(e)])


PREFIX = [0, 7, 4, 12]
EXTEND = [5, 3, 0, 1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pass_new_kv", [True, False])
def test_extend_is_causal_over_prefix_and_new_tokens(dtype: torch.dtype, pass_new_kv: bool) -> None:
    pool, q, k_new, v_new = _batch(PREFIX, EXTEND, dtype, seed=0)
    out = _extend(
        pool,
        q,
        k_new if pass_new_kv else None,
        v_new if pass_new_kv else None,
        [p + e for p, e in zip(PREFIX, EXTEND, strict=True)],
        EXTEND,
    )
    _check(out, pool, q, PREFIX, EXTEND, _causal, dtype)


def test_extend_reads_new_keys_from_k_extend_not_the_pool() -> None:
    pool, q, k_new, v_new = _batch(PREFIX, EXTEND, torch.float32, seed=1)
    lens = [p + e for p, e in zip(PREFIX, EXTEND, strict=True)]
    expected = _extend(pool, q, None, None, lens, EXTEND)
    for i, (p, e) in enumerate(zip(PREFIX, EXTEND, strict=True)):
        pool.k_buffer[pool.slots(i, p, p + e)] = 1e3  # stale pool rows must not be read
    assert torch.equal(_extend(pool, q, k_new, v_new, lens, EXTEND), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("window", "logit_cap", "with_sinks", "is_causal"),
    [(3, 0.0, False, True), (0, 2.5, False, True), (0, 0.0, True, True), (0, 0.0, False, False)],
)
def test_extend_window_cap_sinks_and_non_causal(
    dtype: torch.dtype, window: int, logit_cap: float, with_sinks: bool, is_causal: bool
) -> None:
    pool, q, k_new, v_new = _batch(PREFIX, EXTEND, dtype, seed=2)
    sinks = torch.linspace(0.5, -1.5, HQ) if with_sinks else None
    out = _extend(
        pool,
        q,
        k_new,
        v_new,
        [p + e for p, e in zip(PREFIX, EXTEND, strict=True)],
        EXTEND,
        logit_cap=logit_cap,
        window=window,
        sinks=sinks,
        is_causal=is_causal,
    )

    def visible(i: int, p: int, e: int) -> torch.Tensor:
        return torch.tensor(
            [
                [
                    (n <= p + j or not is_causal) and (window <= 0 or p + j - n < window)
                    for n in range(p + e)
                ]
                for j in range(e)
            ]
        )

    _check(out, pool, q, PREFIX, EXTEND, visible, dtype, logit_cap=logit_cap, sinks=sinks)


# A draft tree of 5 tokens: 0 is the root (the last verified token), 1 and 2 its children,
# 3 a child of 1, 4 a child of 2. Row j: which draft tokens token j may see (its ancestors).
PARENTS = [-1, 0, 0, 1, 2]


def _ancestors(j: int) -> set[int]:
    seen = set()
    while j >= 0:
        seen.add(j)
        j = PARENTS[j]
    return seen


TREE = torch.tensor(
    [[n in _ancestors(j) for n in range(len(PARENTS))] for j in range(len(PARENTS))]
)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["qlen_only", "full_mask"])
def test_verify_tree_mask_limits_draft_tokens_to_their_ancestors(
    dtype: torch.dtype, mode: str
) -> None:
    prefix = [6, 1, 10]
    n = len(PARENTS)
    extend = [n] * len(prefix)
    pool, q, k_new, v_new = _batch(prefix, extend, dtype, seed=3)
    if mode == "qlen_only":
        flat = torch.cat([TREE.reshape(-1)] * len(prefix))
    else:
        flat = torch.cat(
            [
                torch.cat((torch.ones(n, p, dtype=torch.bool), TREE), dim=1).reshape(-1)
                for p in prefix
            ]
        )
    out = _extend(pool, q, k_new, v_new, [p + n for p in prefix], extend, tree_mask=flat)

    def visible(i: int, p: int, e: int) -> torch.Tensor:
        return torch.cat((torch.ones(e, p, dtype=torch.bool), TREE), dim=1)

    _check(out, pool, q, prefix, extend, visible, dtype)


def test_tree_mask_blocks_fills_the_prefix_of_a_qlen_only_mask() -> None:
    blocks = tree_mask_blocks(torch.tensor([True, False, True, True]), [2], [5])
    assert blocks[0].tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_tree_mask_of_the_wrong_length_is_rejected() -> None:
    with pytest.raises(ValueError, match="QLEN_ONLY"):
        tree_mask_blocks(torch.ones(5, dtype=torch.bool), [2], [5])


@pytest.mark.parametrize("is_cross_attention", [True, False])
def test_extend_with_encoder_tokens_reads_the_right_span(is_cross_attention: bool) -> None:
    encoder, prefix, extend = [3, 5], [2, 0], [2, 4]
    lens = [e + p + x for e, p, x in zip(encoder, prefix, extend, strict=True)]
    pool = make_pool(lens, HKV, D, DV, torch.float32, seed=4)
    q = torch.randn(sum(extend), HQ, D, generator=torch.Generator().manual_seed(5))
    out = _extend(
        pool,
        q,
        None,
        None,
        [p + x for p, x in zip(prefix, extend, strict=True)],
        extend,
        encoder_lens=torch.tensor(encoder),
        is_cross_attention=is_cross_attention,
    )
    for i in range(2):
        q0, e = _starts(extend)[i], extend[i]
        if is_cross_attention:
            slots = pool.slots(i, 0, encoder[i])
            visible = torch.ones(e, encoder[i], dtype=torch.bool)
        else:
            slots = pool.slots(i, encoder[i], lens[i])
            visible = _causal(i, prefix[i], e)
        values = pool.v_buffer[slots]
        ref = reference_attention(q[q0 : q0 + e], pool.k_buffer[slots], values, visible, SCALE)
        scale = attention_scale(values)
        assert_close(out[q0 : q0 + e], ref, torch.float32, max(D, slots.numel()), scale=scale)


def test_extend_rejects_an_extend_longer_than_the_sequence() -> None:
    pool, q, k_new, v_new = _batch([0], [3], torch.float32, seed=6)
    with pytest.raises(ValueError, match="does not fit"):
        _extend(pool, q, k_new, v_new, [2], [3])
