"""Warm-up for gate calibration: run the drafter ungated, record every verified node.

The engine logs each verified node (depth, path / draft log-prob, layer confidence, accepted)
into an echo-gating :class:`~echo_gating.records.RecordWriter`. Drafting must reach the full
depth without gates so every depth sees accepted and rejected drafts: the warm-up policy is
EAGLE-2 expansion with a generous per-request tree (``warmup_policy_config``). The prompts are
training-style prompts from the *end* of the seeded pool (disjoint from the training prefix and
from the benchmark sets).

:func:`confidence_histograms` draws the per-depth histograms of the layer confidence of
accepted vs rejected gate samples (the paper's layer-wise confidence figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from echo_core.sampling import SamplingParams
from echo_gating.records import RecordSet, RecordWriter, gate_samples
from echo_scheduler.config import PolicyConfig
from echo_scheduler.policies import make_policy
from echo_server.drafting.base import Drafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt
from echo_server.training.instructions import POOL_SIZE, build_prompts


def calibration_prompts(count: int, seed: int = 0) -> list[Prompt]:
    """The last ``count`` prompts of the seeded pool (training uses a prefix of it)."""
    return build_prompts(POOL_SIZE, seed)[-count:]


def warmup_policy_config(max_depth: int = 8) -> PolicyConfig:
    """EAGLE-2 trees reaching ``max_depth``: top-4 frontier, 6 children per node, 40 nodes."""
    return PolicyConfig(
        base_depth=max_depth,
        topk=4,
        num_draft_tokens=41,
        max_depth=max_depth,
        max_width=6,
    )


def warmup_records(
    loaded: LoadedModel,
    drafter: Drafter,
    prompts: Sequence[Prompt],
    max_tokens: int = 128,
    max_batch: int = 4,
    max_depth: int = 8,
    meta: dict[str, str] | None = None,
) -> RecordSet:
    """Greedy generation of ``prompts`` with ungated full-depth drafting; every verified node."""
    cfg = warmup_policy_config(max_depth)
    engine = Engine(
        loaded.model,
        loaded.tokenizer,
        make_policy("eagle2", cfg),
        drafter,
        EngineConfig(budget=max_batch * cfg.tree_nodes, max_batch=max_batch, kv_slots=8192),
    )
    writer = RecordWriter(meta or {})
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    for p in prompts:
        engine.submit(GenerationRequest(p.prompt_id, prompt=p.text, chat=p.chat, params=params))
    with tqdm(total=len(prompts), desc="warm-up", unit="prompt") as bar:
        while engine.has_work():
            report = engine.step()
            report.append_records(writer)
            for event in report.events:
                if event.finish_reason is not None:
                    engine.pop_finished(event.request_id)
                    bar.update(1)
    return writer.finish()


def confidence_histograms(
    records: RecordSet, path: Path, max_depth: int = 8, title: str = ""
) -> None:
    """PNG of per-depth layer-confidence histograms, accepted vs rejected gate samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = gate_samples(records)
    cols = 4
    rows = (max_depth + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    bins = torch.linspace(0, 1, 21).tolist()
    for d in range(1, max_depth + 1):
        ax = axes[(d - 1) // cols][(d - 1) % cols]
        at = samples.depth == d
        acc = samples.confidence[at & samples.accepted].tolist()
        rej = samples.confidence[at & ~samples.accepted].tolist()
        ax.hist(rej, bins=bins, alpha=0.6, color="tab:red", label=f"rejected ({len(rej)})")
        ax.hist(acc, bins=bins, alpha=0.6, color="tab:blue", label=f"accepted ({len(acc)})")
        ax.set_title(f"depth {d}", fontsize=9)
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("layer confidence", fontsize=8)
    fig.suptitle(title or "draft confidence per depth: accepted vs rejected", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
