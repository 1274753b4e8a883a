"""Training the draft head on self-distilled sequences (resumable, seeded, with progress bars).

Loss of pass k (:mod:`echo_server.drafting.unroll`) on the rows whose label is a generated
token, weighted ``depth_decay ** (k - 1)``::

    p    = softmax(f_{t+k} W_d^T)            the target's next-token distribution on V_d
    L_k  = CE(p, log_softmax(f^k_t W_d^T)) + reg_weight * SmoothL1(f^k_t, f_{t+k})

(EAGLE's classification + feature-regression loss; soft labels because the target's
distribution is free to compute from its feature.) AdamW with linear warm-up and cosine decay.
A checkpoint (head, optimizer, schedule, position) is written every ``checkpoint_every`` steps
and at each epoch's end; a restarted run continues from it and reproduces the same batches.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from echo_lab.training.dataset import Batch, batches, make_batch
from echo_lab.training.selfdistill import DistilledSequence
from echo_server.drafting.eagle_head import EagleHead
from echo_server.drafting.unroll import pass_mask, unrolled_features

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    epochs: int = 6
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 20
    max_batch_tokens: int = 1536
    depths: int = 3
    reg_weight: float = 0.5
    depth_decay: float = 0.8
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    bf16: bool = True  # bfloat16 autocast for the matmuls (float32 master weights)


@dataclass(frozen=True, slots=True)
class DepthAgreement:
    """Teacher-forced top-1 agreement with the target per depth (generated tokens only)."""

    top1: tuple[float, ...]  # P(draft argmax == target token) at depth k = 1..K
    chain: tuple[float, ...]  # P(depths 1..k all agree)
    rows: int


def _shifted(features: Tensor, k: int) -> Tensor:
    """``features[:, t + k]`` at row t, zero past the end: [B, T, H]."""
    return F.pad(features[:, k:], (0, 0, 0, k))


def pass_losses(head: EagleHead, batch: Batch, cfg: TrainConfig) -> tuple[Tensor, list[float]]:
    """Total loss and the per-pass cross-entropies (for the progress bar).

    Matmuls run under bfloat16 autocast when ``cfg.bf16`` (5x the float32 GEMM throughput on
    CPUs with AVX512-BF16 / AMX); losses are computed in float32 on float32 master weights.
    """
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
        preds = unrolled_features(head, batch.features, batch.tokens, cfg.depths, batch.aux)
    t = batch.features.shape[1]
    total = torch.zeros(())
    ces: list[float] = []
    for k, pred in enumerate(preds, start=1):
        mask = pass_mask(batch.answer_from, batch.lengths, t, k)
        if not bool(mask.any()):
            ces.append(float("nan"))
            continue
        target = _shifted(batch.features, k)[mask]
        chosen = pred[mask].float()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            with torch.no_grad():
                target_logits = head.logits(target)
            draft_logits = head.logits(chosen)
        p = torch.softmax(target_logits.float(), dim=-1)
        logq = torch.log_softmax(draft_logits.float(), dim=-1)
        ce = -(p * logq).sum(-1).mean()
        reg = F.smooth_l1_loss(chosen, target)
        total = total + cfg.depth_decay ** (k - 1) * (ce + cfg.reg_weight * reg)
        ces.append(float(ce.detach()))
    return total, ces


@torch.no_grad()
def agreement(
    head: EagleHead, seqs: Sequence[DistilledSequence], depths: int, max_batch_tokens: int = 4096
) -> DepthAgreement:
    """Teacher-forced top-1 agreement at depths 1..``depths`` on ``seqs`` (module docstring of
    :mod:`unroll`): depth k's draft token is compared with the target's generated token."""
    hits = [0] * depths
    chain = [0] * depths
    rows = 0
    with_aux = bool(head.config.aux_layers)
    for group in batches(seqs, max_batch_tokens):
        batch = make_batch(group, with_aux)
        preds = unrolled_features(head, batch.features, batch.tokens, depths, batch.aux)
        t = batch.features.shape[1]
        # rows where every depth has a generated label: chains are comparable across depths
        mask = pass_mask(batch.answer_from, batch.lengths, t, depths)
        mask &= pass_mask(batch.answer_from, batch.lengths, t, 1)
        ok_all = torch.ones(int(mask.sum()), dtype=torch.bool)
        for k, pred in enumerate(preds, start=1):
            draft = head.target_ids(head.logits(pred[mask]).argmax(-1))
            label = F.pad(batch.tokens[:, k + 1 :], (0, k))[:, :t][mask]
            ok = draft == label
            ok_all &= ok
            hits[k - 1] += int(ok.sum())
            chain[k - 1] += int(ok_all.sum())
        rows += int(mask.sum())
    n = max(rows, 1)
    return DepthAgreement(tuple(h / n for h in hits), tuple(c / n for c in chain), rows)


def _lr(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def data_signature(seqs: Sequence[DistilledSequence]) -> dict[str, int]:
    """What a resumed training run must find unchanged in its training data: the number of
    sequences and a CRC-32 of their ids in order (a run on another subset or on a work dir
    that has grown since must not continue from this one's state)."""
    ids = "\n".join(s.prompt_id for s in seqs).encode()
    return {"sequences": len(seqs), "crc32": zlib.crc32(ids)}


def train(
    head: EagleHead,
    train_seqs: Sequence[DistilledSequence],
    heldout: Sequence[DistilledSequence],
    cfg: TrainConfig,
    state_path: Path,
) -> tuple[list[DepthAgreement], float]:
    """Train ``head`` in place; returns the held-out agreement after each epoch and the wall
    seconds spent training (summed over resumed runs)."""
    torch.manual_seed(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups: list[dict[str, Any]] = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay},
    ]
    opt = torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        weight_decay=0.0,
    )
    plans = [
        batches(train_seqs, cfg.max_batch_tokens, seed=cfg.seed + e) for e in range(cfg.epochs)
    ]
    total_steps = sum(len(p) for p in plans)
    step, seconds = 0, 0.0
    history: list[DepthAgreement] = []
    data = data_signature(train_seqs)
    if state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        if state["config"] != asdict(cfg):
            raise ValueError(f"{state_path} was written with another TrainConfig; remove it")
        if state.get("data", data) != data:  # states written before the signature: unchecked
            raise ValueError(
                f"{state_path} was written for other training data ({state['data']}, now "
                f"{data}); remove it or train in another work dir"
            )
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
        step, seconds = int(state["step"]), float(state["seconds"])
        history = [DepthAgreement(**h) for h in state["history"]]
        log.info("train_resumed", step=step, of=total_steps)

    def save() -> None:
        tmp = state_path.with_suffix(".tmp")
        torch.save(
            {
                "config": asdict(cfg),
                "data": data,
                "head": head.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "seconds": seconds,
                "history": [asdict(h) for h in history],
            },
            tmp,
        )
        tmp.rename(state_path)

    with_aux = bool(head.config.aux_layers)
    head.train()
    bar = tqdm(total=total_steps, initial=step, desc="train-draft", unit="batch")
    done = 0
    for epoch, plan in enumerate(plans):
        for group in plan:
            if done < step:
                done += 1
                continue
            start = time.perf_counter()
            for g in opt.param_groups:
                g["lr"] = _lr(step, total_steps, cfg)
            loss, ces = pass_losses(head, make_batch(group, with_aux), cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch stub lacks annotations
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            step += 1
            done += 1
            seconds += time.perf_counter() - start
            bar.update(1)
            bar.set_postfix(
                epoch=epoch, loss=f"{float(loss.detach()):.3f}", ce=[f"{c:.2f}" for c in ces]
            )
            if step % cfg.checkpoint_every == 0:
                save()
        if len(history) <= epoch:
            head.eval()
            history.append(agreement(head, heldout, cfg.depths))
            head.train()
            log.info("epoch_done", epoch=epoch, heldout_top1=history[-1].top1, step=step)
            save()
    bar.close()
    head.eval()
    return history, seconds
