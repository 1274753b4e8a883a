"""decode_attention_cpu against the dense float64 reference, called as SGLang's intel_amx backend
calls it (positional arguments in its order), in float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

import sgl_kernel

from .attention_reference import PagedPool, attention_scale, make_pool, reference_attention
from .tolerance import assert_close

OPS = torch.ops.sgl_kernel
DTYPES = [torch.float32, torch.bfloat16]
HQ, HKV, D, DV = 6, 2, 24, 20
SPLITS = 8  # the backend's num_kv_splits: only sizes attn_logits
SCALE = D**-0.5


def _decode(
    pool: PagedPool,
    q: torch.Tensor,
    seq_lens: list[int],
    *,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor | None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    logit_cap: float = 0.0,
    window: int = 0,
    encoder_lens: torch.Tensor | None = None,
    is_cross_attention: bool = False,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    batch = q.shape[0]
    out = q.new_empty(batch, HQ, DV)
    attn_logits = torch.zeros(batch, HQ, SPLITS, DV + 1)
    OPS.decode_attention_cpu(
        q,
        pool.k_buffer,
        pool.v_buffer,
        k_scale,
        v_scale,
        out,
        key,
        value,
        loc,
        attn_logits,
        pool.req_to_token,
        pool.req_pool_indices,
        torch.tensor(seq_lens, dtype=torch.int64),
        SCALE,
        logit_cap,
        is_cross_attention,
        window,
        encoder_lens,
        sinks,
    )
    return out


def _query(batch: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(batch, HQ, D, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_stores_the_new_token_then_attends_to_all_keys(dtype: torch.dtype) -> None:
    lens = [1, 5, 17, 40]
    pool = make_pool(lens, HKV, D, DV, dtype, seed=0)
    q = _query(len(lens), dtype, 1)
    gen = torch.Generator().manual_seed(2)
    key = torch.randn(len(lens), HKV, D, generator=gen).to(dtype)
    value = torch.randn(len(lens), HKV, DV, generator=gen).to(dtype)
    loc = torch.stack([pool.slots(b, n - 1, n)[0] for b, n in enumerate(lens)])
    out = _decode(pool, q, lens, key=key, value=value, loc=loc)
    assert torch.equal(pool.k_buffer[loc], key)
    assert torch.equal(pool.v_buffer[loc], value)
    for b, n in enumerate(lens):
        slots = pool.slots(b, 0, n)
        visible = torch.ones(1, n, dtype=torch.bool)
        values = pool.v_buffer[slots]
        ref = reference_attention(q[b : b + 1], pool.k_buffer[slots], values, visible, SCALE)
        assert_close(out[b : b + 1], ref, dtype, max(D, n), scale=attention_scale(values))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("window", "logit_cap", "with_sinks", "k_scale"),
    [(4, 0.0, False, 1.0), (0, 3.0, False, 1.0), (0, 0.0, True, 1.0), (0, 0.0, False, 0.5)],
)
def test_decode_window_cap_sinks_and_scale(
    dtype: torch.dtype, window: int, logit_cap: float, with_sinks: bool, k_scale: float
) -> None:
    lens = [3, 11, 26]
    pool = make_pool(lens, HKV, D, DV, dtype, seed=3)
    q = _query(len(lens), dtype, 4)
    sinks = torch.linspace(-1.0, 2.0, HQ) if with_sinks else None
    v_scale = 2.0 if k_scale != 1.0 else 1.0
    out = _decode(
        pool,
        q,
        lens,
        key=None,
        value=None,
        loc=None,
        k_scale=k_scale,
        v_scale=v_scale,
        logit_cap=logit_cap,
        window=window,
        sinks=sinks,
    )
    for b, n in enumerate(lens):
        slots = pool.slots(b, 0, n)
        visible = torch.ones(1, n, dtype=torch.bool)
        if window > 0:
            visible[0, : max(0, n - window)] = False
        keys = pool.k_buffer[slots].double() * k_scale
        values = pool.v_buffer[slots].double() * v_scale
        ref = reference_attention(q[b : b + 1], keys, values, visible, SCALE, logit_cap, sinks)
        scale = attention_scale(values)
        assert_close(out[b : b + 1], ref, dtype, max(D, n), scale=scale)


@pytest.mark.parametrize("is_cross_attention", [True, False])
def test_decode_with_encoder_tokens_reads_the_right_span(is_cross_attention: bool) -> None:
    encoder = [4, 6]
    lens = [3, 9]
    pool = make_pool(
        [e + n for e, n in zip(encoder, lens, strict=True)], HKV, D, DV, torch.float32, 5
    )
    q = _query(2, torch.float32, 6)
    encoder_lens = torch.tensor(encoder)
    out = _decode(
        pool,
        q,
        lens,
        key=None,
        value=None,
        loc=None,
        encoder_lens=encoder_lens,
        is_cross_attention=is_cross_attention,
    )
    for b in range(2):
        start, stop = (0, encoder[b]) if is_cross_attention else (encoder[b], encoder[b] + lens[b])
        slots = pool.slots(b, start, stop)
        visible = torch.ones(1, stop - start, dtype=torch.bool)
        values = pool.v_buffer[slots]
        ref = reference_attention(q[b : b + 1], pool.k_buffer[slots], values, visible, SCALE)
        scale = attention_scale(values)
        assert_close(out[b : b + 1], ref, torch.float32, max(D, stop - start), scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_draft_decode_over_branch_rows_sees_prefix_and_own_branch(dtype: torch.dtype) -> None:
    """The intel_amx multi-step draft backend: one table row per branch, from
    build_draft_decode_metadata_cpu; branch tk's draft slots sit after the prefix."""
    topk, num_steps = 2, 3
    prefix = [5, 9]
    pool = make_pool([n + topk * num_steps for n in prefix], HKV, D, DV, dtype, seed=7)
    seq_lens = torch.tensor(prefix)
    table = sgl_kernel.build_draft_decode_metadata_cpu(
        pool.req_to_token,
        pool.req_pool_indices,
        seq_lens,
        topk,
        num_steps,
        pool.req_to_token.shape[1],
    )
    rows = len(prefix) * topk
    branch_pool = PagedPool(pool.k_buffer, pool.v_buffer, table, torch.arange(rows))
    gen = torch.Generator().manual_seed(8)
    for step in range(num_steps - 1):
        q = _query(rows, dtype, 10 + step)
        key = torch.randn(rows, HKV, D, generator=gen).to(dtype)
        value = torch.randn(rows, HKV, DV, generator=gen).to(dtype)
        loc = torch.stack(
            [
                pool.slots(b, n + tk * num_steps + step, n + tk * num_steps + step + 1)[0]
                for b, n in enumerate(prefix)
                for tk in range(topk)
            ]
        )
        lens = [n + step + 1 for n in prefix for _ in range(topk)]
        out = _decode(branch_pool, q, lens, key=key, value=value, loc=loc)
        for r in range(rows):
            b, tk = divmod(r, topk)
            first = prefix[b] + tk * num_steps
            slots = torch.cat((pool.slots(b, 0, prefix[b]), pool.slots(b, first, first + step + 1)))
            visible = torch.ones(1, slots.numel(), dtype=torch.bool)
            values = pool.v_buffer[slots]
            ref = reference_attention(q[r : r + 1], pool.k_buffer[slots], values, visible, SCALE)
            scale = attention_scale(values)
            assert_close(out[r : r + 1], ref, dtype, max(D, slots.numel()), scale=scale)


def test_decode_rejects_seq_lens_of_another_batch() -> None:
    pool = make_pool([2, 3], HKV, D, DV, torch.float32, seed=9)
    with pytest.raises(ValueError, match="seq_lens"):
        _decode(pool, _query(2, torch.float32, 1), [2], key=None, value=None, loc=None)


def test_decode_needs_loc_with_a_new_key() -> None:
    pool = make_pool([2], HKV, D, DV, torch.float32, seed=10)
    key = torch.zeros(1, HKV, D)
    with pytest.raises(ValueError, match="loc"):
        _decode(
            pool, _query(1, torch.float32, 1), [2], key=key, value=torch.zeros(1, HKV, DV), loc=None
        )
