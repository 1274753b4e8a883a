"""Warm-up for gate calibration: run the drafter ungated, record every verified node.

The engine logs each verified node (depth, path / draft log-prob, layer confidence, accepted)
into an echo-gating :class:`~echo_gating.records.RecordWriter`. Drafting must reach the full
depth without gates so every depth sees accepted and rejected drafts: the warm-up policy is
EAGLE-2 expansion with a generous per-request tree (``warmup_policy_config``). The prompts are
training-style prompts from the *end* of the seeded pool (disjoint from the training prefix and
from the benchmark sets).

:func:`confidence_histograms` draws the per-depth histograms of the layer confidence of
accepted vs rejected gate samples (the paper's layer-wise confidence figure);
:func:`layerwise_histograms` the same under other gate labels, e.g. its conditional version.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from echo_core.sampling import SamplingParams
from echo_gating.records import GateSamples, RecordSet, RecordWriter, gate_samples
from echo_lab.training.instructions import POOL_SIZE, build_prompts
from echo_scheduler.config import PolicyConfig
from echo_scheduler.policies import make_policy
from echo_server.drafting.base import Drafter
from echo_server.engine import Engine, EngineConfig, GenerationRequest
from echo_server.model.loader import LoadedModel
from echo_server.prompts import Prompt


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
    for d in range(1, max_depth + 1):
        ax = axes[(d - 1) // cols][(d - 1) % cols]
        _panel(ax, samples, d, f"depth {d}", ("accepted", "rejected"))
    for ax in axes[-1]:
        ax.set_xlabel("layer confidence", fontsize=8)
    fig.suptitle(title or "draft confidence per depth: accepted vs rejected", fontsize=10)
    _save(fig, path)


LABEL_TITLES = {
    "reached": ("depth {d}: L >= {d}", ("L >= d", "L < d")),
    "next": ("depth {d}: L >= {e}", ("L >= d+1", "L <= d")),
    "conditional": ("depth {d}: L >= {e} | L >= {d}", ("continues", "stops at d")),
}
"""Per gate label rule (echo_gating.layerwise): panel title and the two classes' names."""


def layerwise_histograms(
    samples: GateSamples,
    path: Path,
    max_depth: int = 6,
    rules: Sequence[str] = ("reached", "conditional"),
    title: str = "",
) -> None:
    """PNG of the layer confidence ``C_b(d)`` per depth (columns) and gate label rule (rows),
    positives against negatives (:mod:`echo_gating.layerwise`): with ``("reached",
    "conditional")`` the paper's layer-wise confidence figure above its conditional version.
    ``samples`` from :func:`~echo_gating.records.gate_samples` (with request ids and steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(rules), max_depth, figsize=(2.4 * max_depth, 2.3 * len(rules)), squeeze=False
    )
    for i, rule in enumerate(rules):
        labelled = samples.relabelled(rule)
        name, classes = LABEL_TITLES[rule]
        for d in range(1, max_depth + 1):
            _panel(axes[i][d - 1], labelled, d, name.format(d=d, e=d + 1), classes)
    for ax in axes[-1]:
        ax.set_xlabel("layer confidence", fontsize=8)
    fig.suptitle(title or "layer confidence per depth and gate label", fontsize=10)
    _save(fig, path)


def _panel(ax: Any, samples: GateSamples, depth: int, title: str, classes: tuple[str, str]) -> None:
    """One depth's two histograms (positives blue, negatives red) over 20 bins of [0, 1]."""
    bins = torch.linspace(0, 1, 21).tolist()
    at = samples.depth == depth
    pos = samples.confidence[at & samples.accepted].tolist()
    neg = samples.confidence[at & ~samples.accepted].tolist()
    ax.hist(neg, bins=bins, alpha=0.6, color="tab:red", label=f"{classes[1]} ({len(neg)})")
    ax.hist(pos, bins=bins, alpha=0.6, color="tab:blue", label=f"{classes[0]} ({len(pos)})")
    ax.set_title(title, fontsize=8)
    ax.set_xlim(0, 1)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
