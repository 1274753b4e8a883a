"""One ECHO decode step inside SGLang: EAGLE's pool in, SGLang's verify tensors out.

The worker (:mod:`~echo_sglang.worker`) lets SGLang's EAGLE draft run and build its
own verify input, captures the pool (:mod:`~echo_sglang.pool_capture`), and then
calls :meth:`EchoStep.plan` and :func:`overwrite_verify_input`:

1. pool = every EAGLE candidate (:func:`~echo_sglang.eagle_pool.pool_from_eagle`);
2. the policy gates and selects at most ``K = config.step_budget(B)`` nodes for the whole batch,
   at most ``N - 1`` per request (:class:`~echo_sglang.selection.PoolReplay`; for
   ``echo_device``, :class:`~echo_sglang.fixed_replay.FixedPoolReplay`, no host sync);
3. the SuperTree is encoded in SGLang's padded layout with EAGLE's shapes (``T = N``, accept width
   ``S + 1``) and copied *into* EAGLE's tensors, which keeps their storage: SGLang's CUDA-graph
   and attention-backend buffers stay valid.

After the verify pass SGLang hands back the accepted draft tokens per request
(``on_verify_complete_cpu``); :meth:`EchoStep.observe` pairs them with the planned step and feeds
the policy and, when a gate is in use, echo-gating's drift monitor (:mod:`~echo_sglang.feedback`).

Nothing here imports sglang: it is exercised on CPU against SGLang's own Triton kernels.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from echo_gating.drift import DriftConfig, DriftMonitor, DriftReport
from echo_scheduler.device.adapter import DeviceEchoPolicy
from echo_sglang.config import EchoConfig
from echo_sglang.eagle_pool import EaglePool, concat_draft_lists, pool_from_eagle
from echo_sglang.feedback import FeedbackError, StepFeedback, step_feedback
from echo_sglang.fixed_encode import fixed_verify_input, write_tree_blocks
from echo_sglang.fixed_replay import FixedChoice, FixedPoolReplay
from echo_sglang.masks import TreeMaskMode, write_mask
from echo_sglang.padded import PaddedVerifyInput, padded_verify_input
from echo_sglang.selection import PoolReplay, Selection

VERIFY_FIELDS = (
    ("draft_token", "draft_token"),
    ("positions", "positions"),
    ("retrieve_index", "retrive_index"),
    ("retrieve_next_token", "retrive_next_token"),
    ("retrieve_next_sibling", "retrive_next_sibling"),
)
"""(EagleVerifyInput attribute, PaddedVerifyInput attribute) pairs copied every step."""

logger = logging.getLogger(__name__)

LOG_FEEDBACK = "ECHO_SGLANG_LOG_FEEDBACK"
"""Set to 1 to log every fed-back step (``echo_feedback ...``: running totals): tests, debugging."""


@dataclass(slots=True)
class _Planned:
    """The step planned last: its pool and the policy's choice (a packed Selection, or the
    fixed layout's masks, packed on first use)."""

    pool: EaglePool
    packed: Selection | None = None
    choice: FixedChoice | None = None

    def selection(self) -> Selection:
        if self.packed is None:
            if self.choice is None:
                raise ValueError("a planned step holds a selection or a fixed choice")
            self.packed = self.choice.selection(self.pool)
        return self.packed


class EchoStep:
    """ECHO's selection for one SGLang worker (the policy keeps per-step state).

    Counters for metrics: ``observed_steps``, ``accepted_tokens`` and ``verified_nodes`` (draft
    tokens, bonus excluded) over the steps SGLang reported back; ``refused_feedback`` counts
    reports that did not match the planned step (logged, then dropped); ``drift_records`` the
    ``(depth, confidence, accepted)`` observations handed to the drift monitor.
    """

    def __init__(self, config: EchoConfig, drift: DriftConfig | None = None) -> None:
        self.config = config
        policy = config.make_policy()
        self.replay: PoolReplay | FixedPoolReplay = (
            FixedPoolReplay(policy) if isinstance(policy, DeviceEchoPolicy) else PoolReplay(policy)
        )
        self.monitor = None if config.gate is None else DriftMonitor(config.gate, drift)
        self._planned: _Planned | None = None
        self._advised = False
        self.observed_steps = self.accepted_tokens = self.verified_nodes = 0
        self.refused_feedback = self.drift_records = 0
        self._log_feedback = os.environ.get(LOG_FEEDBACK, "0") == "1"

    def plan(
        self,
        score_list: Sequence[Tensor],
        token_list: Sequence[Tensor],
        parents_list: Sequence[Tensor],
        root_token: Tensor,  # [B] int64, the verified last token per request
        seq_lens: Tensor,  # [B] int64, cached tokens per request
    ) -> tuple[Selection, PaddedVerifyInput]:
        """Select this step's SuperTree and encode it (module docstring, steps 1-3)."""
        layout = self.plan_layout(score_list, token_list, parents_list, root_token, seq_lens)
        planned = self._planned
        assert planned is not None  # plan_layout just set it
        return planned.selection(), layout

    def plan_layout(
        self,
        score_list: Sequence[Tensor],
        token_list: Sequence[Tensor],
        parents_list: Sequence[Tensor],
        root_token: Tensor,  # [B] int64, the verified last token per request
        seq_lens: Tensor,  # [B] int64, cached tokens per request
    ) -> PaddedVerifyInput:
        """:meth:`plan`'s encoding alone, what the worker copies into SGLang's tensors. With
        ``echo_device`` (:class:`~echo_sglang.fixed_replay.FixedPoolReplay`) the decisions and
        the encoding (:func:`~echo_sglang.fixed_encode.fixed_verify_input`) read nothing on the
        host; the packed SuperTree is built only when feedback or :meth:`plan` needs it."""
        cfg = self.config
        scores, tokens, parents = concat_draft_lists(score_list, token_list, parents_list)
        pool = pool_from_eagle(scores, tokens, parents, cfg.topk)
        b = pool.tree.batch_size
        root, lens = root_token.to(torch.int64), seq_lens.to(torch.int64)
        if isinstance(self.replay, FixedPoolReplay):  # echo_device: the fixed layout
            caps = torch.full((b,), cfg.max_nodes_per_request, dtype=torch.int64)  # host
            choice = self.replay.decide(pool, scores, tokens, parents, cfg.step_batch(caps))
            self._planned = _Planned(pool, choice=choice)
            return fixed_verify_input(
                choice.slots, root, lens, cfg.num_draft_tokens, cfg.num_steps + 1
            )
        caps = torch.full(
            (b,), cfg.max_nodes_per_request, dtype=torch.int64, device=pool.tree.device
        )
        selection = self.replay.select(pool.tree, pool.rank, cfg.step_batch(caps))
        self._planned = _Planned(pool, packed=selection)
        return padded_verify_input(
            selection.tree, root, lens,
            num_draft_tokens=cfg.num_draft_tokens, max_tree_depth=cfg.num_steps + 1,
        )  # fmt: skip

    def observe(self, num_correct: Sequence[int]) -> StepFeedback | None:
        """SGLang's accepted draft tokens per request for the last planned step (bonus excluded).

        Feeds ``policy.observe`` and the drift monitor; returns what was fed, or None when no step
        was planned since the last report (SGLang reports only decode steps, which ECHO plans).
        A report that does not fit the planned step is logged and dropped: serving goes on.
        """
        planned, self._planned = self._planned, None
        if planned is None:
            return None
        selection = planned.selection()
        try:
            fed = step_feedback(selection.tree, planned.pool.tree, selection.drafted, num_correct)
        except FeedbackError as exc:
            self.refused_feedback += 1
            logger.warning("echo_feedback_refused reason=%r", str(exc))
            return None
        self.replay.policy.observe(fed.outcome)
        self.observed_steps += 1
        self.accepted_tokens += int(fed.outcome.accepted_lengths.sum())
        self.verified_nodes += int(fed.outcome.verified.sum())
        if self.monitor is not None:
            obs = fed.observations
            self.monitor.observe(obs.depth, obs.confidence, obs.accepted)
            self.drift_records += int(obs.depth.numel())
            report = self.monitor.check()
            if report.recalibrate and not self._advised:
                logger.warning(
                    "echo_gate_drift policy_version=%s reason=%r",
                    report.policy_version,
                    report.reason,
                )
            self._advised = report.recalibrate
        if self._log_feedback:
            logger.info(
                "echo_feedback steps=%d accepted=%d verified=%d drift_records=%d",
                self.observed_steps, self.accepted_tokens, self.verified_nodes,
                self.drift_records,
            )  # fmt: skip
        return fed

    @property
    def sync_free(self) -> bool:
        """:meth:`plan_layout` reads nothing on the host (``echo_device``), and SGLang's mask
        buffer may be overwritten with ``prefix_filled`` (:func:`overwrite_verify_input`)."""
        return isinstance(self.replay, FixedPoolReplay)

    def drift(self) -> DriftReport | None:
        """The drift monitor's report (None without a gate)."""
        return None if self.monitor is None else self.monitor.check()


def overwrite_verify_input(
    verify_input: Any,
    layout: PaddedVerifyInput,
    mask_mode: TreeMaskMode | int,
    prefix_filled: bool = False,
) -> None:
    """Copy ``layout`` into SGLang's ``EagleVerifyInput`` tensors in place.

    The shapes are EAGLE's (same ``T``, same batch); the mask is encoded in ``mask_mode`` and
    written over the front of ``custom_mask``, which may be a larger preallocated buffer, in that
    buffer's dtype (bool, or 0/1 uint8 for the bool encodings: :func:`~.masks.write_mask`).
    ``prefix_filled``: the buffer holds EAGLE's own mask for this step, so FULL_MASK's prefix
    columns are already True and only the tree blocks are written, with no host read
    (:func:`~echo_sglang.fixed_encode.write_tree_blocks`).
    """
    for ours, theirs in VERIFY_FIELDS:
        dst: Tensor = getattr(verify_input, ours)
        src: Tensor = getattr(layout, theirs)
        if dst.shape != src.shape:
            raise ValueError(
                f"EagleVerifyInput.{ours} has shape {tuple(dst.shape)}, ECHO built "
                f"{tuple(src.shape)}: the verify width must stay --speculative-num-draft-tokens"
            )
        dst.copy_(src)
    try:
        if prefix_filled:
            write_tree_blocks(verify_input.custom_mask, layout, mask_mode)
            return
        write_mask(verify_input.custom_mask, layout.custom_mask(mask_mode))
    except ValueError as exc:
        raise ValueError(f"{exc} (mask mode {TreeMaskMode(int(mask_mode)).name})") from exc
