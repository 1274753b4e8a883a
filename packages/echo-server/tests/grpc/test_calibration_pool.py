"""Calibration sharing on the controller: pooling, renumbering, recalibration gates."""

from __future__ import annotations

import torch

from echo_gating.synthetic import SyntheticSpec, synthetic_records
from echo_server.grpc.calibration_pool import CalibrationPool, PoolConfig

PAIR = ("target.gguf", "ngram")


def test_records_of_two_nodes_never_share_a_request_id() -> None:
    pool = CalibrationPool(PoolConfig(min_records=1, min_interval_s=0.0))
    gen = torch.Generator().manual_seed(0)
    a = synthetic_records(SyntheticSpec(), gen, num_requests=3, steps=2)
    b = synthetic_records(SyntheticSpec(), gen, num_requests=3, steps=2)
    pool.add(PAIR, a)
    pool.add(PAIR, b)

    records = pool.claim(PAIR, now=0.0)

    assert records is not None
    assert torch.unique(records.request_id).numel() == 6
    assert dict(records.meta) == {"target": PAIR[0], "drafter": PAIR[1]}


def test_recalibration_waits_for_enough_records_and_the_interval() -> None:
    pool = CalibrationPool(PoolConfig(max_records=50_000, min_records=5_000, min_interval_s=30.0))
    gen = torch.Generator().manual_seed(1)
    pool.add(PAIR, synthetic_records(SyntheticSpec(), gen, num_requests=10, steps=10))
    assert pool.claim(PAIR, now=0.0) is None  # 800 records < 5000

    pool.add(PAIR, synthetic_records(SyntheticSpec(), gen, num_requests=100, steps=10))
    records = pool.claim(PAIR, now=0.0)
    assert records is not None
    assert pool.claim(PAIR, now=0.0) is None  # busy until installed

    policy = pool.recalibrate(records)
    pool.install(PAIR, policy, now=0.0)
    assert pool.policy(PAIR) == policy
    assert policy.checkpoints
    assert pool.claim(PAIR, now=10.0) is None  # too soon
    assert pool.claim(PAIR, now=31.0) is not None


def test_the_pool_keeps_only_the_newest_records() -> None:
    pool = CalibrationPool(PoolConfig(max_records=1_000, min_records=1))
    gen = torch.Generator().manual_seed(2)
    for _ in range(5):
        pool.add(PAIR, synthetic_records(SyntheticSpec(), gen, num_requests=5, steps=10))  # 400

    assert 1_000 <= pool.records(PAIR) < 1_400
