"""The exact per-step cut of a selection (echo_scheduler.cut)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import pytest
import torch

from echo_core.testing import HostSyncCounter
from echo_scheduler.cost import ProfileCost, VerifyCostModel
from echo_scheduler.cut import RowBuffers, best_rows, exact_cut
from echo_scheduler.errors import PolicyError
from echo_scheduler.interface import RowPrice

Cut = Callable[..., torch.Tensor]


@pytest.fixture(params=[True, False], ids=["gathered", "masked"])
def cut(request: pytest.FixtureRequest) -> Cut:
    """:func:`exact_cut` gathering the kept keys (the CPU's way) or masking them (a GPU's)."""
    return functools.partial(exact_cut, gather=request.param)


def test_docstring_example_keeps_the_two_rows_that_pay(cut: Cut) -> None:
    cost = ProfileCost((2.0, 3.0, 4.0, 5.0), (0.010, 0.010, 0.011, 0.012))
    keep = cut(torch.tensor([0.9, 0.5, 0.05]), torch.ones(3, dtype=torch.bool), 2,
                     RowPrice(100.0, cost))  # fmt: skip
    assert keep.tolist() == [True, True, False]


def test_cut_is_the_best_prefix_by_brute_force(cut: Cut) -> None:
    g = torch.Generator().manual_seed(0)
    hinge = VerifyCostModel(0.010, 0.0001, 0.002, 12.0)  # flat-ish, then steep past 12 rows
    for _ in range(20):
        key = torch.rand(10, generator=g)
        keep = torch.rand(10, generator=g) < 0.8
        rate = float(torch.rand(1, generator=g)) * 400
        got = cut(key, keep, 4, RowPrice(rate, hinge))
        vals = sorted(key[keep].tolist(), reverse=True)
        worth = [sum(vals[:k]) - rate * hinge.latency_at(4 + k) for k in range(len(vals) + 1)]
        assert int(got.sum()) == max(range(len(worth)), key=lambda k: (worth[k], -k))
        assert bool((got <= keep).all())


def test_equal_keys_are_kept_or_cut_together(cut: Cut) -> None:
    # a parent and its child with the same (min-propagated) key: never split between them
    cost = VerifyCostModel(0.010, 0.0, 0.001, 0.0)
    key = torch.tensor([0.6, 0.3, 0.3])
    for rate, expect in ((100.0, [True, True, True]), (450.0, [True, False, False])):
        assert cut(key, torch.ones(3, dtype=torch.bool), 1, RowPrice(rate, cost)).tolist() == (
            expect
        )


@pytest.mark.parametrize("rate", [0.0, 1e6])
def test_free_rows_keep_everything_and_dear_rows_nothing(rate: float, cut: Cut) -> None:
    cost = VerifyCostModel(0.010, 0.0, 0.001, 0.0)
    keep = torch.tensor([True, True, False, True])
    got = cut(torch.tensor([0.5, 0.4, 0.9, 0.2]), keep, 2, RowPrice(rate, cost))
    assert got.tolist() == (keep.tolist() if rate == 0.0 else [False] * 4)


def test_row_price_rejects_nonsense() -> None:
    cost = VerifyCostModel(0.010, 0.0, 0.001, 0.0)
    for rate, scale in itertools.product((-1.0, float("inf")), (1.0,)):
        with pytest.raises(ValueError, match="row price"):
            RowPrice(rate, cost, scale)
    with pytest.raises(ValueError, match="row price"):
        RowPrice(1.0, cost, 0.0)


def test_best_rows_keep_the_best_whatever_their_price() -> None:
    key = torch.tensor([0.9, 0.5, 0.4, 0.05])
    keep = torch.tensor([True, True, True, False])
    assert best_rows(key, keep, 0).tolist() == [False] * 4
    assert best_rows(key, keep, 1).tolist() == [True, False, False, False]
    assert best_rows(key, keep, 2).tolist() == [True, True, False, False]
    assert best_rows(key, keep, 9).tolist() == [True, True, True, False]  # all there are
    tied = torch.tensor([0.6, 0.6, 0.2])  # equal keys: the tiebreak, then the index
    every = torch.ones(3, dtype=torch.bool)
    assert best_rows(tied, every, 1).tolist() == [True, False, False]
    assert best_rows(tied, every, 1, torch.tensor([0.1, 0.3, 0.9])).tolist() == [False, True, False]
    with HostSyncCounter() as syncs:
        best_rows(key, keep, 2)
    assert syncs.total == 0


def test_the_cut_makes_no_host_sync_at_any_size() -> None:
    # issue #44: without gathering, the kept count and the threshold stay on the device; the
    # cut is the gathered one
    cost = ProfileCost((1.0, 64.0, 512.0), (0.010, 0.012, 0.040))
    for n in (1, 16, 400):
        key = torch.rand(n, generator=torch.Generator().manual_seed(n))
        keep = key > 0.3
        price = RowPrice(50.0, cost)
        with HostSyncCounter() as syncs:
            masked = exact_cut(key, keep, 8, price, gather=False)
            # a static bound on the kept count: the candidates are a top-k, the same cut
            bounded = exact_cut(key, keep, 8, price, gather=False, limit=n)
        assert syncs.total == 0, syncs.counts
        assert torch.equal(masked, exact_cut(key, keep, 8, price, gather=True))
        assert torch.equal(bounded, masked)


def test_a_bound_on_the_kept_count_cuts_alike_with_ties() -> None:
    """``limit`` >= the kept count, keys with exact ties (a cut between equal keys is not
    allowed): the top-k candidates cut where the sorted ones do."""
    g = torch.Generator().manual_seed(3)
    cost = ProfileCost((1.0, 8.0, 64.0), (0.010, 0.011, 0.030))
    for trial in range(40):
        n = 1 + trial % 13
        key = torch.randint(0, 4, (n,), generator=g).float() / 4
        keep = torch.rand(n, generator=g) < 0.6
        price = RowPrice(float(torch.rand(1, generator=g)) * 300, cost)
        want = exact_cut(key, keep, 4, price, gather=False)
        kept = int(keep.sum())
        for limit in {kept, kept + 1, n, 2 * n}:
            assert torch.equal(exact_cut(key, keep, 4, price, False, None, limit), want)


def test_nothing_kept_stays_nothing(cut: Cut) -> None:
    cost = VerifyCostModel(0.010, 0.0, 0.001, 0.0)
    keep = torch.zeros(3, dtype=torch.bool)
    got = cut(torch.tensor([0.5, 0.4, 0.9]), keep, 2, RowPrice(1.0, cost))
    assert got.tolist() == [False] * 3


@pytest.mark.parametrize(
    "model",
    [
        VerifyCostModel(0.010, 0.0001, 0.002, 12.0),
        ProfileCost((1.0, 5.0, 9.0, 30.0), (0.010, 0.011, 0.0135, 0.040)),
    ],
    ids=["hinge", "profile"],
)
def test_a_latency_table_holds_the_models_values_bit_for_bit(
    model: VerifyCostModel | ProfileCost,
) -> None:
    """``seconds`` read from the table equals ``seconds`` evaluated by the model at every row
    count, across the hinge's knee and the profile's points (an off-by-one lookup would not)."""
    price = RowPrice(50.0, model, 0.8)
    table = price.latency_table(40, torch.device("cpu"))
    rows = torch.arange(41)
    assert torch.equal(price.seconds(rows, None, table), price.seconds(rows))
    scale = torch.tensor(0.8, dtype=torch.float64)
    assert torch.equal(price.seconds(rows, scale, table), price.seconds(rows))


def test_buffers_cut_as_the_price_does_and_a_short_table_is_named() -> None:
    """A captured step's buffers (rate, scale, the latency table) give the price's own cut,
    bit for bit; a table that does not reach ``B + N`` rows is an error, not a wrong read."""
    g = torch.Generator().manual_seed(1)
    hinge = VerifyCostModel(0.010, 0.0001, 0.002, 12.0)
    for _ in range(20):
        key = torch.rand(10, generator=g)
        keep = torch.rand(10, generator=g) < 0.8
        price = RowPrice(float(torch.rand(1, generator=g)) * 400, hinge, 0.7)
        buffers = RowBuffers(
            torch.tensor(price.rate, dtype=torch.float64),
            torch.tensor(price.scale, dtype=torch.float64),
            price.latency_table(4 + 10, torch.device("cpu")),
        )
        want = exact_cut(key, keep, 4, price, gather=False)
        assert torch.equal(exact_cut(key, keep, 4, price, False, buffers), want)
    short = RowBuffers(buffers.rate, buffers.scale, price.latency_table(4 + 9, torch.device("cpu")))
    with pytest.raises(PolicyError, match="latency table"):
        exact_cut(key, keep, 4, price, False, short)
