"""Host syncs of one plugin step (plan + overwrite): a budget that batch and tree width never grow.

On CUDA every counted call (echo_core.testing.HostSyncCounter) stalls the CPU until the GPU has
caught up. The policy is replayed depth by depth (selection.PoolReplay), so the count grows with
the number of draft steps S, by at most ``SYNCS_PER_DEPTH`` each; it must not grow with the batch
B, the top-k or the verify width N. The padded layout used to sync three times per node (about
2,200 times per step at B = 48, S = 4, k = 4, N = 16).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from echo_core.testing import HostSyncCounter
from echo_sglang.args import EchoArgs
from echo_sglang.config import EagleShape, resolve
from echo_sglang.masks import TreeMaskMode
from echo_sglang.step import EchoStep, overwrite_verify_input
from echo_sglang.synthetic import eagle_draft

SYNCS_PER_DEPTH = 25
SYNCS_PER_STEP = 15
"""Budget of one step with S draft steps: ``SYNCS_PER_DEPTH * S + SYNCS_PER_STEP``."""

SHAPES = [(3, 2, 8), (3, 4, 16), (4, 4, 16), (4, 8, 32)]
"""(S, k, N) of EAGLE's draft: two widths at each depth."""


ECHO_DEVICE_SYNCS = 2
"""``echo_device``'s whole step (plan_layout + overwrite), whatever S, k, N and B: two reads of
the step's caps, which the plugin keeps on the host (StepBatch's check, the pre-check's live
count); nothing on the device."""


def _step_syncs(steps: int, topk: int, n: int, batch: int, policy: str = "echo") -> HostSyncCounter:
    gen = torch.Generator().manual_seed(steps * 100 + batch)
    lists = eagle_draft(gen, batch, steps, topk, vocab=32)
    root, seq_lens = torch.arange(batch) + 7, torch.arange(batch) % 5 + 1
    verify_input = SimpleNamespace(
        draft_token=torch.zeros(batch * n, dtype=torch.int64),
        positions=torch.zeros(batch * n, dtype=torch.int64),
        retrieve_index=torch.zeros(batch, n, dtype=torch.int64),
        retrieve_next_token=torch.zeros(batch, n, dtype=torch.int64),
        retrieve_next_sibling=torch.zeros(batch, n, dtype=torch.int64),
        custom_mask=torch.zeros(batch * n * (n + 5), dtype=torch.uint8),  # Triton's buffer
    )
    step = EchoStep(resolve(EchoArgs(policy=policy), EagleShape(steps, topk, n)))
    step.plan_layout(*lists, root, seq_lens)  # the first step warms the policy's state up
    with HostSyncCounter() as syncs:  # the worker's calls
        layout = step.plan_layout(*lists, root, seq_lens)
        mode = TreeMaskMode.FULL_MASK
        overwrite_verify_input(verify_input, layout, mode, prefix_filled=step.sync_free)
    return syncs


def test_step_syncs_depend_on_draft_depth_only() -> None:
    totals = {(s, k, n, b): _step_syncs(s, k, n, b).total for s, k, n in SHAPES for b in (8, 48)}
    for s in {s for s, _, _ in SHAPES}:
        at_depth = {v for (d, _, _, _), v in totals.items() if d == s}
        assert len(at_depth) == 1, totals  # the same for every batch size and width
        assert at_depth.pop() <= SYNCS_PER_DEPTH * s + SYNCS_PER_STEP, totals


def test_echo_device_step_syncs_are_flat_in_depth_width_and_batch() -> None:
    """Issue #44: ECHO in the fixed layout (FixedPoolReplay, fixed_encode) reads only its host
    caps at every shape, against 49-58 syncs for ``echo`` through PoolReplay at these shapes."""
    for s, k, n in SHAPES:
        for b in (8, 48, 256):
            assert _step_syncs(s, k, n, b, "echo_device").total == ECHO_DEVICE_SYNCS, (s, k, n, b)
