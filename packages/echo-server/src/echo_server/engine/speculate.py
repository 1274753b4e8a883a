"""Phases 1-4 of a decode step (draft, allocate, verify, accept): the speculative half.

It changes no request state: on any error the verify rows' KV slots are returned and
:class:`SpeculationError` is raised (the cause chained), so the engine can retry the step per
request and fail only the culprit (``Engine._decode_isolated``). Phases 5-6 (commit, emit) take
the :class:`Speculation` it returns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.acceptance import AcceptResult
from echo_scheduler.budget import BudgetChain
from echo_scheduler.device.driver import drive
from echo_scheduler.driver import DrivenStep
from echo_scheduler.interface import Policy, StepBatch
from echo_server.drafting.base import Drafter
from echo_server.engine.acceptance import accept
from echo_server.engine.draft_source import DrafterSource
from echo_server.engine.report import StepTimer
from echo_server.engine.request import RequestState
from echo_server.engine.verify import PassOutput, verify_pass
from echo_server.kv.pool import KVPool, RequestHandle
from echo_server.model.llama import LlamaModel


class SpeculationError(RuntimeError):
    """A step failed before committing anything (its cause chained); safe to retry."""


@dataclass(frozen=True, slots=True)
class Speculation:
    """What a step's first half hands to commit and emit."""

    timer: StepTimer
    step: StepBatch
    driven: DrivenStep
    handles: list[RequestHandle]
    out: PassOutput
    result: AcceptResult


def speculate(
    model: LlamaModel,
    kv: KVPool,
    drafter: Drafter,
    policy: Policy,
    budget: BudgetChain,
    batch: list[RequestState],
    max_depth: int,
    policy_device: torch.device,
) -> Speculation:
    """Draft under the budget chain's step (K, floor), allocate and verify the selected tree's
    rows on ``model``, accept a path per request (module docstring)."""
    timer = StepTimer()
    slots: Tensor | None = None
    device = model.device
    try:
        drafter.begin_step([s.context for s in batch], [s.request_id for s in batch])
        # A step emits accepted + 1 tokens: never draft past what max_tokens allows.
        caps = torch.tensor(
            [max(s.remaining - 1, 0) for s in batch], dtype=torch.int64, device=policy_device
        )
        serials = torch.tensor([s.serial for s in batch], dtype=torch.int64, device="cpu")
        step = budget.step(caps, serials)
        driven = drive(policy, DrafterSource(drafter), step, max_depth=max_depth)
        # the selected SuperTree to the model's device (no copy when it is there already)
        driven = dataclasses.replace(driven, tree=driven.tree.to(device))
        timer.mark("draft")
        handles = [s.kv for s in batch if s.kv is not None]
        roots = torch.tensor([s.root for s in batch], dtype=torch.int64, device=device)
        tree = driven.tree
        out = verify_pass(model, kv, handles, roots, tree, drafter.aux_layers)
        slots = out.slots
        timer.mark("verify")
        result = accept(tree, out.logits, batch)
        timer.mark("accept")
    except Exception as exc:
        if slots is not None:
            kv.free(slots)
        raise SpeculationError(f"{type(exc).__name__}: {exc}") from exc
    return Speculation(timer, step, driven, handles, out, result)
