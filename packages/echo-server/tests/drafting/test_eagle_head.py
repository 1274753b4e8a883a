"""The draft head's pieces have the documented shapes and refuse inconsistent configs."""

from __future__ import annotations

import pytest
import torch

from echo_core.tolerance import float_tolerance
from echo_server.drafting.eagle_head import EagleHead, EagleHeadConfig, default_config, rope
from echo_server.drafting.testing import DRAFT_VOCAB, HIDDEN, VOCAB, tiny_config, tiny_head


def test_row_pipeline_shapes() -> None:
    head = tiny_head()
    feats, toks = torch.randn(5, HIDDEN), torch.randint(0, VOCAB, (5,))
    x = head.fuse(feats, toks)
    q, k, v = head.project(x, torch.arange(5))
    assert x.shape == (5, HIDDEN)
    assert q.shape == (5, 4, 8)
    assert k.shape == (5, 2, 8)
    assert v.shape == (5, 2, 8)
    out = head.finish(x, torch.randn(5, 32))
    assert out.shape == (5, HIDDEN)
    assert head.logits(out).shape == (5, DRAFT_VOCAB)
    assert head.target_ids(torch.tensor([0, 19])).tolist() == [1, 39]


def test_batched_leading_dims_match_flat_rows() -> None:
    head = tiny_head()
    feats, toks = torch.randn(2, 3, HIDDEN), torch.randint(0, VOCAB, (2, 3))
    pos = torch.arange(6).view(2, 3)
    q, _, _ = head.project(head.fuse(feats, toks), pos)
    q_flat, _, _ = head.project(head.fuse(feats.view(6, HIDDEN), toks.view(6)), pos.view(6))
    torch.testing.assert_close(q.view(6, 4, 8), q_flat)


def test_rope_at_position_zero_is_identity_and_preserves_norm() -> None:
    x = torch.randn(3, 2, 8)
    torch.testing.assert_close(rope(x, torch.zeros(3, dtype=torch.int64), 1e4), x)
    y = rope(x, torch.tensor([1, 7, 100]), 1e4)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_unattached_head_has_no_target_rows() -> None:
    assert not EagleHead(tiny_config()).attached


def test_attach_rejects_a_target_of_another_vocabulary() -> None:
    head = EagleHead(tiny_config())
    with pytest.raises(ValueError, match="target embed"):
        head.attach_target(torch.zeros(VOCAB + 1, HIDDEN), torch.zeros(VOCAB + 1, HIDDEN))


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_kv_heads", 3), ("head_dim", 7), ("draft_vocab_size", VOCAB + 1), ("hidden_size", 0)],
)
def test_config_rejects_inconsistent_shapes(field: str, value: int) -> None:
    kwargs = tiny_config().to_dict()
    kwargs[field] = value
    with pytest.raises(ValueError, match=field.split("_")[0]):
        EagleHeadConfig.from_dict(kwargs)


def test_default_config_for_smollm2_is_about_4m_parameters() -> None:
    cfg = default_config(576, 49152, 8192)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size) == (9, 3, 1536)
    assert 4.0e6 < EagleHead(cfg).num_parameters() < 4.5e6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_inference_matches_the_module_path(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    head = EagleHead(default_config(128, 300, 50)).eval()
    head.attach_target(torch.randn(300, 128), torch.randn(300, 128))
    head.to(dtype)
    feats, toks, pos = (
        torch.randn(5, 128, dtype=dtype),
        torch.randint(0, 300, (5,)),
        torch.arange(5),
    )

    def run() -> torch.Tensor:
        with torch.no_grad():
            x = head.fuse(feats, toks)
            q, _, _ = head.project(x, pos)
            return head.logits(head.finish(x, q.reshape(5, -1)))

    plain = run()
    if not head.pack_for_inference():
        pytest.skip("oneDNN packing is not available here")
    # One decoder layer, longest reduction max(2H, MLP) = 384, |logit| ~33. float32: 3.3e-4
    # (observed 1.9e-5: oneDNN's packed products round differently from F.linear's). bfloat16:
    # each of the six chained projections rounds its output, so depth 6 (observed 0 on the
    # Intel Xeon VM: both paths run the same oneDNN kernel there).
    c = head.config
    reduction = max(2 * c.hidden_size, c.intermediate_size)
    depth = 1 if dtype == torch.float32 else 6
    atol = float_tolerance(dtype, reduction, depth, scale=float(plain.abs().max()))
    torch.testing.assert_close(run(), plain, atol=atol, rtol=0)
    head.unpack()
    assert torch.equal(run(), plain)
