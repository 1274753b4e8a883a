"""Sampling parameter validation and the batched target distribution."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import Tensor

from echo_core.errors import SamplingParamsError
from echo_core.sampling import SamplingParams, stack_sampling_params, target_probs


def probs_of(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    r = logits.shape[0]
    return target_probs(
        logits,
        torch.full((r,), temperature),
        torch.full((r,), top_k, dtype=torch.int64),
        torch.full((r,), top_p),
    )


def reference_row(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """The rule of the module docstring, one row, in plain Python."""
    v = len(logits)
    if temperature == 0:
        best = max(range(v), key=lambda j: (logits[j], -j))
        return [1.0 if j == best else 0.0 for j in range(v)]
    order = sorted(range(v), key=lambda j: (-logits[j], j))
    kept = order[:top_k] if top_k else order
    top = max(logits[j] / temperature for j in kept)
    weights = {j: math.exp(logits[j] / temperature - top) for j in kept}
    total = sum(weights.values())
    mass, nucleus = 0.0, list[int]()
    for j in kept:
        if nucleus and mass >= top_p:
            break
        nucleus.append(j)
        mass += weights[j] / total
    norm = sum(weights[j] for j in nucleus)
    return [weights[j] / norm if j in nucleus else 0.0 for j in range(v)]


EPS32 = torch.finfo(torch.float32).eps


def _prefix_masses(logits: list[float], temperature: float, top_k: int) -> list[float]:
    """Cumulative probability after each kept token, in the reference's order."""
    if temperature == 0:
        return []
    order = sorted(range(len(logits)), key=lambda j: (-logits[j], j))
    kept = order[:top_k] if top_k else order
    top = max(logits[j] / temperature for j in kept)
    weights = [math.exp(logits[j] / temperature - top) for j in kept]
    total, mass, out = sum(weights), 0.0, []
    for w in weights:
        mass += w / total
        out.append(mass)
    return out


def test_defaults_are_valid_and_not_greedy() -> None:
    params = SamplingParams()
    assert not params.is_greedy
    assert SamplingParams(temperature=0.0).is_greedy


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        ({"temperature": float("nan")}, "nan"),
        ({"temperature": float("inf")}, "inf"),
        ({"temperature": -0.5}, "-0.5"),
        ({"top_k": -1}, "-1"),
        ({"top_k": 2.0}, "2.0"),
        ({"top_p": 0.0}, "0.0"),
        ({"top_p": 1.5}, "1.5"),
        ({"top_p": float("nan")}, "nan"),
        ({"max_tokens": 0}, "0"),
        ({"seed": 1.5}, "1.5"),
        ({"stop": ["x"]}, "['x']"),
        ({"stop": ("",)}, "('',)"),
        ({"ignore_eos": 1}, "1"),
    ],
)
def test_invalid_params_raise_quoting_the_value(kwargs: dict[str, object], quoted: str) -> None:
    name = next(iter(kwargs))
    with pytest.raises(SamplingParamsError, match=rf"{name} .*got {re.escape(quoted)}") as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]  # invalid on purpose
    assert isinstance(info.value, ValueError)


def test_stack_sampling_params() -> None:
    temperature, top_k, top_p = stack_sampling_params(
        [SamplingParams(temperature=0.0, top_k=5), SamplingParams(top_p=0.5)]
    )
    assert temperature.tolist() == [0.0, 1.0]
    assert top_k.dtype == torch.int64
    assert top_k.tolist() == [5, 0]
    assert top_p.tolist() == [1.0, 0.5]


def test_worked_example_from_the_docstring() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    probs = probs_of(logits, 1.0, top_p=0.6)
    assert probs.tolist()[0] == pytest.approx([0.625, 0.375, 0.0])


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.integers(-4, 4), min_size=1, max_size=7),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_k=st.integers(0, 8),
    top_p=st.sampled_from([1e-6, 0.2, 0.5, 0.9, 0.999, 1.0]),
)
def test_matches_the_python_reference(
    logits: list[int], temperature: float, top_k: int, top_p: float
) -> None:
    # Integer logits make ties common; the reference breaks them by token id.
    z = [float(x) for x in logits]
    # A nucleus cut whose cumulative mass lies within float32 rounding of top_p may fall on
    # either side of it in float32 (e.g. two tied tokens of mass 0.5 - 6e-8 against p = 0.5):
    # both answers are correct to the dtype, so such boundary cases are not compared.
    assume(all(abs(m - top_p) > 64 * EPS32 for m in _prefix_masses(z, temperature, top_k)))
    got = probs_of(torch.tensor([z]), temperature, top_k, top_p)[0]
    want = reference_row(z, temperature, top_k, top_p)
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    assert got.dtype == torch.float32


def test_rows_use_their_own_parameters() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, generator=g)
    params = [(0.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.6), (1.0, 4, 0.8)]
    probs = target_probs(
        logits,
        torch.tensor([p[0] for p in params]),
        torch.tensor([p[1] for p in params]),
        torch.tensor([p[2] for p in params]),
    )
    for row, (t, k, p) in enumerate(params):
        assert probs[row].tolist() == pytest.approx(reference_row(logits[row].tolist(), t, k, p))
    assert torch.allclose(probs.sum(dim=-1), torch.ones(4))


def test_top_k_one_equals_greedy_one_hot() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(-2, 3, (64, 11), generator=g).to(torch.float32)  # many ties
    assert torch.equal(probs_of(logits, 1.7, top_k=1), probs_of(logits, 0.0))
    assert torch.equal(probs_of(logits, 0.0).argmax(dim=-1), logits.argmax(dim=-1))


def test_tiny_top_p_keeps_only_the_top_token() -> None:
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0]])
    assert probs_of(logits, 1.0, top_p=1e-9).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_temperature_zero_rows_are_one_hot_and_others_untouched() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.5], [1.0, 2.0, 0.5]])
    probs = target_probs(
        logits, torch.tensor([0.0, 1.0]), torch.zeros(2, dtype=torch.int64), torch.ones(2)
    )
    assert probs[0].tolist() == [0.0, 1.0, 0.0]
    assert torch.allclose(probs[1], torch.softmax(logits[1], dim=-1))


def test_low_precision_logits_give_float32() -> None:
    logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    probs = probs_of(logits, 0.8, top_k=2)
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(dim=-1), torch.ones(3))


def test_empty_batch() -> None:
    assert probs_of(torch.zeros(0, 5), 1.0).shape == (0, 5)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("temperature", torch.tensor([-1.0, 1.0]), "temperature must be >= 0"),
        ("temperature", torch.tensor([float("nan"), 1.0]), r"temperature must be >= 0, got \[nan"),
        ("temperature", torch.ones(3), r"temperature must have shape \[2\]"),
        ("top_k", torch.tensor([-1, 0]), r"top_k must be >= 0, got \[-1, 0\]"),
        ("top_k", torch.zeros(2, dtype=torch.int32), "top_k must be int64"),
        ("top_p", torch.tensor([0.0, 1.0]), r"top_p must be in \(0, 1\], got \[0.0, 1.0\]"),
        ("top_p", torch.tensor([1.0, 1.5]), r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_batched_params_raise(field: str, value: Tensor, match: str) -> None:
    args = {
        "temperature": torch.ones(2),
        "top_k": torch.zeros(2, dtype=torch.int64),
        "top_p": torch.ones(2),
    }
    args[field] = value
    with pytest.raises(SamplingParamsError, match=match):
        target_probs(torch.zeros(2, 4), args["temperature"], args["top_k"], args["top_p"])


def test_non_float_logits_raise() -> None:
    with pytest.raises(SamplingParamsError, match="logits must be a"):
        probs_of(torch.zeros(2, 4, dtype=torch.int64), 1.0)
