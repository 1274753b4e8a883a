"""The oneDNN-packed projection against ``F.linear``, and its fallbacks.

Packed and unpacked products round differently (oneDNN's blocking depends on the CPU): compared
within :func:`rounding_atol` (float32, reduction ``in_features`` = 64, |y| < ~4.3): 0.97e-5
to 1.8e-5, observed 0 to 4.8e-7.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from echo_core.tolerance import float_tolerance
from echo_server.model.linear import (
    MAX_PADDED_ROWS,
    Linear,
    RowPaths,
    packing_available,
    row_paths,
    single_row_path,
)


def rounding_atol(w: torch.Tensor, expected: torch.Tensor) -> float:
    """Float rounding of ``x @ w.T`` around ``expected`` (module docstring)."""
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    return float_tolerance(w.dtype, w.shape[1], scale=scale)


def _weights(out: int = 96, inp: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(out, inp, generator=g) * 0.1, torch.randn(out, generator=g)


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 17])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_f_linear_up_to_rounding(rows: int, with_bias: bool) -> None:
    w, b = _weights()
    bias = b if with_bias else None
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))
    got = Linear(w, bias)(x)
    assert got.shape == (rows, 96)
    want = F.linear(x, w, bias)
    torch.testing.assert_close(got, want, atol=rounding_atol(w, want), rtol=0)


def test_rows_do_not_depend_on_the_other_rows_beyond_one() -> None:
    w, _ = _weights(256, 128)
    lin = Linear(w)
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(2))
    full = lin(x)
    for m in (2, 4, 8):
        assert torch.equal(lin(x[:m]), full[:m])


def test_non_contiguous_input_is_accepted() -> None:
    w, _ = _weights()
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(3)).t()  # [6, 64] strided
    want = F.linear(x, w)
    torch.testing.assert_close(Linear(w)(x), want, atol=rounding_atol(w, want), rtol=0)


def test_packs_float32_cpu_weights_only_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w, _ = _weights()
    assert packing_available(w) == torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    assert not packing_available(w.to(torch.bfloat16))
    assert Linear(w.to(torch.bfloat16)).packed is None
    monkeypatch.setenv("ECHO_PACKED_LINEAR", "0")
    assert not packing_available(w)
    assert Linear(w).packed is None


@pytest.mark.skipif(not packing_available(torch.zeros(2, 2)), reason="needs oneDNN packing")
def test_single_rows_take_the_plain_weight_when_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    w, b = _weights()
    lin = Linear(w, b)
    x = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(1))
    packed_rows = lin(x)
    packed_one = lin(x[:1])
    lin.plain_single_row = True
    assert torch.equal(lin(x[:1]), F.linear(x[:1], w, b))  # the GEMV, bitwise
    assert torch.equal(lin(x[2:3].reshape(1, 1, -1)).reshape(1, -1), F.linear(x[2:3], w, b))
    assert torch.equal(lin(x), packed_rows)  # two or more rows stay packed
    assert not lin.release_plain()  # the plain copy serves single rows: it stays
    assert lin.weight is not None
    lin.plain_single_row = False
    assert torch.equal(lin(x[:1]), packed_one)
    assert lin.release_plain()
    assert single_row_path(lin) is False  # nothing plain left to choose
    fresh = Linear(w, b)
    for mode, want in (("plain", True), ("packed", False)):
        monkeypatch.setenv("ECHO_LINEAR_SINGLE_ROW", mode)
        assert single_row_path(fresh) is want
    monkeypatch.setenv("ECHO_LINEAR_SINGLE_ROW", "auto")
    assert single_row_path(fresh) in (True, False)  # timed: either answer is legitimate
    assert single_row_path([fresh, Linear(w.clone(), b)]) in (True, False)  # a layer sweep
    assert single_row_path([fresh, lin]) is False  # one of them has no plain copy left
    assert single_row_path([]) is False
    monkeypatch.setenv("ECHO_LINEAR_SINGLE_ROW", "fast")
    with pytest.raises(ValueError, match="ECHO_LINEAR_SINGLE_ROW must be one of"):
        single_row_path(fresh)


@pytest.mark.skipif(not packing_available(torch.zeros(2, 2)), reason="needs oneDNN packing")
def test_padded_calls_return_the_unpadded_rows() -> None:
    w, b = _weights(256, 128)
    lin = Linear(w, b)
    x = torch.randn(7, 128, generator=torch.Generator().manual_seed(4))
    unpadded = {m: lin(x[:m]) for m in range(1, 8)}
    lin.pad_to = (4, 4, 4, 6, 6)  # 1-3 rows as 4, 4-5 as 6, 6 and more as they come
    for m in range(1, 8):
        got = lin(x[:m])
        assert got.shape == (m, 256)
        if m >= 2:  # rows are independent from two on: padding changes no bit
            assert torch.equal(got, unpadded[m])
        else:  # one row takes the multi-row path: rounding only
            want = F.linear(x[:1], w, b)
            torch.testing.assert_close(got, want, atol=rounding_atol(w, want), rtol=0)
    assert torch.equal(lin(x[:2].reshape(1, 2, 128)), unpadded[2].reshape(1, 2, 256))
    lin.plain_single_row = True  # the GEMV still serves single rows when chosen
    assert torch.equal(lin(x[:1]), F.linear(x[:1], w, b))


@pytest.mark.skipif(not packing_available(torch.zeros(2, 2)), reason="needs oneDNN packing")
def test_row_paths_table_is_a_legal_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    w, b = _weights(512, 256)
    group = [Linear(w.clone(), b) for _ in range(3)]
    monkeypatch.setenv("ECHO_LINEAR_PAD", "auto")
    paths = row_paths(group)  # timed: any legal table is a legitimate answer
    assert len(paths.pad_to) <= MAX_PADDED_ROWS
    assert all(m <= k <= MAX_PADDED_ROWS for m, k in enumerate(paths.pad_to, start=1))
    assert not paths.pad_to or paths.pad_to[-1] != len(paths.pad_to)  # trailing identities cut
    paths.apply(group)
    assert all(lin.pad_to == paths.pad_to for lin in group)
    monkeypatch.setenv("ECHO_LINEAR_PAD", "off")
    assert row_paths(group).pad_to == ()
    for mode, plain in (("plain", True), ("packed", False)):
        assert row_paths(group, mode, pad="off") == RowPaths(plain)
        assert row_paths(group, mode, pad="auto").plain_single_row is plain
    group[0].plain_single_row = False
    group[0].release_plain()
    assert row_paths(group, "plain", pad="off") == RowPaths(False)  # no plain copy left
    assert row_paths(Linear(w.to(torch.bfloat16))) == RowPaths(False)  # nothing packed
    monkeypatch.setenv("ECHO_LINEAR_PAD", "always")
    with pytest.raises(ValueError, match="ECHO_LINEAR_PAD must be one of"):
        row_paths(group)
