"""Request streams in the replay: composition, the request-level warm-up split, block intervals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from echo_lab.replay.paired import block_length, resample_index
from echo_lab.replay.run import compose_steps, split_warmup
from echo_lab.sim.rows import TraceRow, compose_streams, has_requests, streams
from echo_scheduler.errors import TraceError


def named(rows: list[TraceRow], per_request: int) -> list[TraceRow]:
    """The fixture's rows as requests of ``per_request`` consecutive rows each, listed
    out of order (a trace lists rows in settling order)."""
    out = [
        replace(r, request=f"q{i // per_request}", request_step=i % per_request + 1)
        for i, r in enumerate(rows)
    ]
    return out[::-1]


def test_streams_replay_each_request_in_order_and_move_on(rows: list[TraceRow]) -> None:
    reqs = named(rows[:40], 4)  # 10 requests of 4 rows
    assert has_requests(reqs)
    assert not has_requests(rows)
    lanes = streams(reqs)
    assert len(lanes) == 10
    assert all([r.request_step for r in lane] == [1, 2, 3, 4] for lane in lanes)
    steps = compose_streams(reqs, 3, 9, torch.Generator().manual_seed(1))
    assert len(steps) == 9
    assert all(s.batch_size == 3 for s in steps)
    for slot in range(3):
        names = [s.requests[slot] for s in steps if s.requests is not None]
        numbers = [s.request_steps[slot] for s in steps if s.request_steps is not None]
        assert names[0] == f"{slot}/0"
        visits = [int(n.split("/")[1]) for n in names]
        assert visits == sorted(visits)  # a slot never goes back to an earlier visit
        for prev, cur, a, b in zip(names, names[1:], numbers, numbers[1:], strict=False):
            assert b == a + 1 if cur == prev else b == 1  # in order; a new request starts at 1
    with pytest.raises(TraceError, match="know their request"):
        compose_streams(rows[:10], 2, 2, torch.Generator())
    twice = [*reqs, replace(reqs[0])]  # two runs gave one request the same id
    with pytest.raises(TraceError, match="decode step twice"):
        streams(twice)


def test_compose_steps_uses_streams_only_when_rows_know_their_requests(
    rows: list[TraceRow],
) -> None:
    plain = compose_steps(rows, 4, 3, 0)
    assert all(s.requests is None for s in plain)
    streamed = compose_steps(named(rows, 5), 4, 3, 0)
    assert all(s.requests is not None for s in streamed)
    assert streamed[0].requests == ("0/0", "1/0", "2/0", "3/0")


def test_warmup_split_keeps_every_request_on_one_side(rows: list[TraceRow]) -> None:
    reqs = named(rows, 10)
    warm, rest = split_warmup(reqs, 0.3, 0)
    assert (warm, rest) == split_warmup(reqs, 0.3, 0)
    assert {r.request for r in warm}.isdisjoint({r.request for r in rest})
    n = len({r.request for r in reqs})
    assert len({r.request for r in warm}) == round(n * 0.3)
    assert len(warm) + len(rest) == len(reqs)
    with pytest.raises(TraceError, match="at least 100"):
        split_warmup(named(rows[:120], 10), 0.3, 0)
    with pytest.raises(TraceError, match="none is left"):
        split_warmup(named(rows[:120], 60), 0.9, 0)  # 2 requests: both go to the warm-up


def test_block_bootstrap_draws_runs_of_consecutive_steps() -> None:
    assert [block_length(s) for s in (1, 8, 20, 80)] == [1, 2, 3, 4]
    idx = resample_index(20, 50, 0)
    assert idx.shape == (50, 20)
    assert torch.equal(idx, resample_index(20, 50, 0))
    step = (idx[:, 1:] - idx[:, :-1]).remainder(20)
    # inside a block of 3 the next index is the next step (circularly)
    assert bool((step[:, 0] == 1).all())
    assert bool((step[:, 1] == 1).all())
    iid = resample_index(5, 3, 1, block=1)
    assert iid.shape == (3, 5)
    assert int(iid.min()) >= 0
    assert int(iid.max()) < 5
