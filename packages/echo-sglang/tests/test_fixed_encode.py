"""Issue #44: the fixed layout's encoder (fixed_encode) writes what padded_verify_input writes for
the same choice, and the whole ``echo_device`` plugin step reads nothing on the host."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_core.acceptance import greedy_accept
from echo_core.testing import HostSyncCounter
from echo_gating.testing import stepped_gate
from echo_scheduler.config import PolicyConfig
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_scheduler.interface import StepBatch
from echo_sglang.args import EchoArgs
from echo_sglang.config import EagleShape, resolve
from echo_sglang.eagle_pool import concat_draft_lists, pool_from_eagle
from echo_sglang.fixed_encode import fixed_verify_input, write_tree_blocks
from echo_sglang.fixed_replay import FixedPoolReplay
from echo_sglang.masks import TreeMaskMode, write_mask
from echo_sglang.padded import padded_verify_input
from echo_sglang.step import EchoStep, overwrite_verify_input
from echo_sglang.synthetic import eagle2_selection, eagle_draft, following_targets, padded_targets

from .conftest import SGLang

FIELDS = ("draft_token", "positions", "retrive_index", "retrive_next_token",
          "retrive_next_sibling", "tree_mask", "num_tokens", "seq_lens")  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from([(2, 2, 4), (3, 3, 8), (4, 4, 16), (5, 2, 9), (4, 3, 13)]),
    batch=st.integers(1, 6),
    share=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_the_fixed_encoder_writes_what_the_packed_one_writes(
    seed: int, shape: tuple[int, int, int], batch: int, share: float
) -> None:
    steps, topk, n = shape
    config = PolicyConfig(
        base_depth=steps, topk=topk, num_draft_tokens=n, max_depth=steps, max_width=topk
    )
    replay = FixedPoolReplay(DeviceEchoPolicy(config, stepped_gate()))
    gen = torch.Generator().manual_seed(seed)
    scores, tokens, parents = concat_draft_lists(*eagle_draft(gen, batch, steps, topk))
    pool = pool_from_eagle(scores, tokens, parents, topk)
    caps = torch.full((batch,), n - 1, dtype=torch.int64)
    sb = StepBatch(batch, int(share * batch * (n - 1)), caps)
    choice = replay.decide(pool, scores, tokens, parents, sb)
    root = torch.randint(0, 50, (batch,), generator=gen)
    lens = torch.randint(0, 9, (batch,), generator=gen)
    ours = fixed_verify_input(choice.slots, root, lens, n, steps + 1)
    ref = padded_verify_input(choice.selection(pool).tree, root, lens, n, steps + 1)
    for name in FIELDS:
        assert torch.equal(getattr(ours, name), getattr(ref, name)), name
    assert ours.max_tree_depth == ref.max_tree_depth


STEPS, TOPK, N, B = 3, 3, 8, 4
HOST_CAPS_READS = {"interface.py", "echo.py"}
"""Files whose counted reads in an ``echo_device`` step are of ``StepBatch.max_nodes``, which the
plugin keeps on the host."""


def _eagle_buffer(sgl: SGLang, lists: tuple[list[torch.Tensor], ...], seq_lens: torch.Tensor,
                  dtype: torch.dtype) -> SimpleNamespace:  # fmt: skip
    """EAGLE's verify input for its own tree as SGLang builds it: a mask that is read is filled
    True first (``build_tree_kernel_efficient``'s ``fill_prefix_mask``, which the worker sets
    to ``verify_mask.is_read``), then the tree kernel writes every tree cell."""
    scores, _, parents = concat_draft_lists(*lists)
    selected = eagle2_selection(scores, N)
    mask = torch.ones(int(seq_lens.sum()) * N + N * N * B + 11, dtype=dtype)
    positions = torch.empty(B * N, dtype=torch.int64)
    index, next_token, next_sibling = torch.full((3, B, N), -1, dtype=torch.int64)
    sgl.build_tree(
        parents, selected, seq_lens, mask, positions, index, next_token, next_sibling,
        TOPK, STEPS, N, sgl.tree_mask_mode(int(TreeMaskMode.FULL_MASK)),
    )  # fmt: skip
    return SimpleNamespace(
        draft_token=torch.zeros(B * N, dtype=torch.int64), positions=positions,
        retrieve_index=index.clone(), retrieve_next_token=next_token.clone(),
        retrieve_next_sibling=next_sibling.clone(), custom_mask=mask,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_tree_blocks_over_eagle_s_mask_equal_the_full_encoding(
    sgl: SGLang, dtype: torch.dtype
) -> None:
    """Writing only the [T, T] blocks over the buffer SGLang's EAGLE built gives the whole
    FULL_MASK encoding: SGLang filled the prefix columns True."""
    gen = torch.Generator().manual_seed(3)
    lists = eagle_draft(gen, B, STEPS, TOPK, vocab=32)
    root, seq_lens = torch.arange(B) + 40, torch.tensor([3, 9, 0, 5])
    config = resolve(EchoArgs(policy="echo_device", budget=12), EagleShape(STEPS, TOPK, N))
    layout = EchoStep(config).plan_layout(*lists, root, seq_lens)
    blocks = _eagle_buffer(sgl, lists, seq_lens, dtype)
    write_tree_blocks(blocks.custom_mask, layout, TreeMaskMode.FULL_MASK)
    full = _eagle_buffer(sgl, lists, seq_lens, dtype)
    write_mask(full.custom_mask, layout.custom_mask(TreeMaskMode.FULL_MASK))
    assert torch.equal(blocks.custom_mask, full.custom_mask)


@pytest.mark.parametrize("mode", [TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY])
def test_an_echo_device_step_verifies_in_sglang_s_kernel_without_a_host_sync(
    sgl: SGLang, mode: TreeMaskMode
) -> None:
    gen = torch.Generator().manual_seed(int(mode) + 5)
    lists = eagle_draft(gen, B, STEPS, TOPK, vocab=32)
    root, seq_lens = torch.arange(B) + 7, torch.tensor([4, 1, 6, 2])
    config = resolve(EchoArgs(policy="echo_device", budget=12), EagleShape(STEPS, TOPK, N))
    step = EchoStep(config)
    assert step.sync_free
    verify_input = _eagle_buffer(sgl, lists, seq_lens, torch.bool)
    step.plan_layout(*lists, root, seq_lens)  # the first step warms the policy's state up
    with HostSyncCounter() as syncs:
        layout = step.plan_layout(*lists, root, seq_lens)
        overwrite_verify_input(verify_input, layout, mode, prefix_filled=True)
    # the only reads: the host's own caps (StepBatch's check, the pre-check's live count); on a
    # GPU those stay on the host, the rest of the step on the device
    assert {site.split(":")[0] for _, site in syncs.sites} <= HOST_CAPS_READS, syncs.sites
    selection, again = step.plan(*lists, root, seq_lens)
    assert torch.equal(again.tree_mask, layout.tree_mask)
    tree = selection.tree
    assert tree.num_nodes == 12
    target = following_targets(tree, gen, vocab=32)
    ours = sgl.greedy(layout, padded_targets(tree, target, N))
    ref = greedy_accept(tree, target)
    assert ours.emitted_tokens(tree) == ref.emitted_tokens(tree)
