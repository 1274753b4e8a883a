"""PNG plots of a benchmark run (matplotlib, the optional ``plots`` extra).

- ``throughput.png``: output tokens/s vs concurrency, one line per policy, one panel per workload;
- ``draft_yield.png``: per-step draft yield (accepted / verified) as box plots per policy, one
  panel per concurrency (all workloads pooled);
- ``confidence.png``: per-depth histograms of the path probability of verified draft tokens,
  accepted vs rejected, one row per policy (all runs pooled).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from echo_lab.bench.metrics import CONFIDENCE_BINS, RunResult, pooled_confidence
from echo_lab.bench.suite import SuiteResult

log = structlog.get_logger(__name__)

MAX_CONFIDENCE_DEPTHS = 6


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plots(result: SuiteResult, out_dir: Path) -> list[Path]:
    """Write the three PNGs into ``out_dir``; [] (with a warning) without matplotlib."""
    if not available():
        log.warning("plots_skipped", reason="matplotlib missing: pip install 'echo-server[plots]'")
        return []
    import matplotlib

    matplotlib.use("Agg")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        _throughput(result.runs, out_dir / "throughput.png"),
        _draft_yield(result, out_dir / "draft_yield.png"),
        _confidence(result, out_dir / "confidence.png"),
    ]
    return [p for p in paths if p is not None]


def _policies(runs: Sequence[RunResult]) -> list[str]:
    return list(dict.fromkeys(r.policy for r in runs))


def _throughput(runs: Sequence[RunResult], path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r.workload for r in runs))
    if not workloads:
        return None
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        for policy in _policies(runs):
            pts = sorted(
                (r.concurrency, r.tokens_per_s)
                for r in runs
                if r.workload == w and r.policy == policy
            )
            if pts:
                ax.plot([c for c, _ in pts], [t for _, t in pts], marker="o", label=policy)
        ax.set_xscale("log", base=2)
        ax.set_title(w)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draft_yield(result: SuiteResult, path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    concs = sorted({c for (_, _, c) in result.accumulators})
    policies = [p for p in _policies(result.runs) if p != "plain"]
    if not concs or not policies:
        return None
    fig, axes = plt.subplots(1, len(concs), figsize=(3.2 * len(concs), 3.6), squeeze=False)
    for ax, c in zip(axes[0], concs, strict=True):
        data = [
            [
                y
                for (p, _, cc), acc in result.accumulators.items()
                if p == pol and cc == c
                for y in acc.step_yields
            ]
            for pol in policies
        ]
        ax.boxplot([d if d else [0.0] for d in data], showfliers=False)
        ax.set_xticks(range(1, len(policies) + 1), policies, rotation=60, fontsize=7)
        ax.set_title(f"concurrency {c}")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("draft yield per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _confidence(result: SuiteResult, path: Path) -> Path | None:
    import matplotlib.pyplot as plt

    hists = pooled_confidence(result.accumulators)
    if not hists:
        return None
    depths = min(
        MAX_CONFIDENCE_DEPTHS,
        max(int((h.sum((1, 2)) > 0).nonzero().max()) + 1 for h in hists.values()),
    )
    fig, axes = plt.subplots(
        len(hists), depths, figsize=(2.4 * depths, 1.9 * len(hists)), squeeze=False
    )
    centers = [(i + 0.5) / CONFIDENCE_BINS for i in range(CONFIDENCE_BINS)]
    width = 1.0 / CONFIDENCE_BINS
    for row, (policy, h) in zip(axes, hists.items(), strict=True):
        for d, ax in enumerate(row):
            if not int(h[d].sum()):
                ax.axis("off")
                continue
            for label, idx, color in (("rejected", 0, "tab:red"), ("accepted", 1, "tab:green")):
                counts = h[d, idx]
                n = max(int(counts.sum()), 1)
                ax.bar(
                    centers,
                    (counts.double() / n).tolist(),
                    width=width,
                    alpha=0.5,
                    color=color,
                    label=f"{label} ({int(counts.sum())})",
                )
            ax.set_title(f"{policy} d={d + 1}", fontsize=8)
            ax.tick_params(labelsize=6)
            ax.legend(fontsize=5)
    for ax in axes[-1]:
        ax.set_xlabel("path probability", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
