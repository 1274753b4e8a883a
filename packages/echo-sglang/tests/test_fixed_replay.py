"""Issue #44: ``echo_device`` over EAGLE's pool in the fixed layout (FixedPoolReplay) chooses
what ``echo`` chooses through PoolReplay, node for node, and its decisions make no host sync."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.testing import HostSyncCounter
from echo_gating.policy import GatePolicy
from echo_gating.testing import stepped_gate
from echo_scheduler.config import PolicyConfig
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.interface import StepBatch
from echo_scheduler.policies.echo import EchoPolicy
from echo_sglang.eagle_pool import concat_draft_lists, pool_from_eagle
from echo_sglang.fixed_replay import FixedPoolReplay
from echo_sglang.selection import PoolReplay
from echo_sglang.synthetic import eagle_draft


def _gates(steps: int) -> list[GatePolicy]:
    maps = stepped_gate().acceptance_maps
    return [
        GatePolicy.none(),
        GatePolicy.sparse({2: 0.3}, max_depth=steps),
        stepped_gate(),
        dataclasses.replace(GatePolicy.sparse({1: 0.5}, max_depth=steps), acceptance_maps=maps),
        dataclasses.replace(
            GatePolicy.sparse({2: 0.2}, max_depth=steps), acceptance_maps=maps,
            signal="sibling_margin",
        ),
    ]  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from([(2, 2, 4), (3, 3, 8), (4, 4, 16), (5, 2, 9), (4, 3, 13)]),
    batch=st.integers(1, 6),
    budget_share=st.sampled_from([0.2, 0.5, 1.0]),
    floor=st.sampled_from([0.0, 0.2]),
)
def test_the_fixed_replay_chooses_what_the_pool_replay_chooses(
    seed: int, shape: tuple[int, int, int], batch: int, budget_share: float, floor: float
) -> None:
    steps, topk, n = shape
    config = PolicyConfig(
        base_depth=steps, topk=topk, num_draft_tokens=n, max_depth=steps, max_width=topk
    )
    budget = int(budget_share * batch * (n - 1))
    for gate in _gates(steps):
        ref = PoolReplay(EchoPolicy(config, gate))
        fixed = FixedPoolReplay(DeviceEchoPolicy(config, gate))
        for step in range(3):
            lists = eagle_draft(torch.Generator().manual_seed(seed + step), batch, steps, topk)
            scores, tokens, parents = concat_draft_lists(*lists)
            pool = pool_from_eagle(scores, tokens, parents, topk)
            caps = torch.full((batch,), n - 1, dtype=torch.int64)
            sb = StepBatch(batch, budget, caps, min_utility=floor)
            a = ref.select(pool.tree, pool.rank, sb)
            b = fixed.select(pool, scores, tokens, parents, sb)
            assert torch.equal(a.pool_index, b.pool_index), (gate.mode, step)
            assert torch.equal(a.drafted, b.drafted), (gate.mode, step)


@pytest.mark.parametrize("batch", [8, 64, 256])
def test_the_fixed_replay_decides_without_a_host_sync(batch: int) -> None:
    """Slabs, decisions and the selection's masks: no sync at any batch size. What remains: the
    pre-check's live count and the packed SuperTree of the chosen nodes for the unchanged
    encoder (PoolReplay with ``echo`` makes 83-107 at B = 16-256)."""
    steps, topk, n = 4, 4, 16
    config = PolicyConfig(
        base_depth=steps, topk=topk, num_draft_tokens=n, max_depth=steps, max_width=topk
    )
    policy = DeviceEchoPolicy(config, stepped_gate())
    replay = FixedPoolReplay(policy)
    lists = eagle_draft(torch.Generator().manual_seed(batch), batch, steps, topk)
    scores, tokens, parents = concat_draft_lists(*lists)
    pool = pool_from_eagle(scores, tokens, parents, topk)
    sb = StepBatch(batch, batch * 6, torch.full((batch,), n - 1, dtype=torch.int64))
    replay.select(pool, scores, tokens, parents, sb)  # warm
    with HostSyncCounter() as syncs:
        replay.select(pool, scores, tokens, parents, sb)
    sites = {site.split(":")[0] for (_, site) in syncs.sites}
    assert not sites & {"echo_step.py", "layout.py", "adapter.py"}, syncs.sites  # decisions
    # the live count of the host's pre-check (echo.py), the chosen nodes' SuperTree for the
    # encoder (tree.py's select_nodes) and their pool indices (fixed_replay.py): four in all
    assert syncs.total == 4, syncs.sites
