"""Layer-wise confidence separation under the three gate labels: the table behind the paper's
layer-wise confidence figure, and its conditional version.

For every depth d and label rule (:meth:`~echo_gating.records.GateSamples.relabelled`), the gate
samples at d (one per request, step and depth: the layer confidence ``C_b(d)``) split into
positives and negatives:

- ``reached``: positive iff the accepted length is ``>= d``, the paper's figure (accepted vs
  rejected drafts at depth d). A request that stopped before d counts as rejected at d, so this
  label also separates requests that never got to d, which a gate at d cannot act on;
- ``next``: positive iff the accepted length is ``>= d + 1``, the depths that truncating at d
  would remove;
- ``conditional``: ``next`` among the samples that reached d only, i.e. ``P(L >= d + 1 | L >= d)``:
  what a gate at d decides, for the requests where its decision matters.

Per (depth, rule) a :class:`~echo_gating.checkpoints.DepthSeparation`: the sample count ``n``,
the positives ``n_1`` (rate ``n_1 / n``), the tie-aware AUC of ``C_b(d)`` for positives against
negatives (:func:`~echo_gating.separation.auc`), its Hanley-McNeil 95% lower bound
``AUC - 1.96 SE`` (``auc_lower_bound``, the checkpoint selector's) and the histograms' overlap
on ``[0, 1]``. Worked example (the module's test): two
requests drafted to depth 3 with accepted lengths 2 and 0 have, at depth 1, ``reached`` labels
(yes, no) and ``conditional`` samples only for the first request (label: depth 2 accepted, yes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from echo_gating.checkpoints import DepthSeparation
from echo_gating.records import GateSamples
from echo_gating.separation import auc, overlap

LABEL_RULES = ("reached", "next", "conditional")
"""The gate labels, in the order tables list them."""


@dataclass(frozen=True, slots=True)
class LayerSeparation:
    """One (depth, label rule) cell of :func:`layerwise_separation`."""

    rule: str
    stats: DepthSeparation

    @property
    def positive_rate(self) -> float:
        n = self.stats.count
        return self.stats.accepted / n if n else math.nan


def layerwise_separation(
    samples: GateSamples, max_depth: int, rules: Sequence[str] = LABEL_RULES
) -> tuple[LayerSeparation, ...]:
    """Every (depth, rule) for depths ``1..max_depth``, depth-major (module docstring).

    ``samples`` must carry request ids and steps (:func:`~echo_gating.records.gate_samples`)
    for the ``next`` and ``conditional`` rules.
    """
    labelled = {rule: samples.relabelled(rule) for rule in rules}
    out = []
    for d in range(1, max_depth + 1):
        for rule in rules:
            s = labelled[rule]
            at = s.depth == d
            conf, hit = s.confidence[at], s.accepted[at]
            n = int(hit.numel())
            stats = DepthSeparation(
                depth=d,
                count=n,
                accepted=int(hit.sum()),
                auc=auc(conf, hit) if n else math.nan,
                overlap=overlap(conf, hit, value_range=(0.0, 1.0)) if n else math.nan,
            )
            out.append(LayerSeparation(rule, stats))
    return tuple(out)


def layerwise_markdown(rows: Sequence[LayerSeparation]) -> str:
    """A Markdown table, one line per depth: per rule ``AUC [lower] (n, positive rate)``."""
    rules = list(dict.fromkeys(r.rule for r in rows))
    head = "| depth | " + " | ".join(rules) + " |"
    lines = [head, "|---|" + "---|" * len(rules)]
    for d in sorted({r.stats.depth for r in rows}):
        cells = {r.rule: r for r in rows if r.stats.depth == d}
        lines.append(f"| {d} | " + " | ".join(_cell(cells.get(rule)) for rule in rules) + " |")
    return "\n".join(lines)


def _cell(row: LayerSeparation | None) -> str:
    if row is None or row.stats.count == 0:
        return "-"
    n, rate = row.stats.count, row.positive_rate
    if math.isnan(row.stats.auc):
        return f"- (n {n}, rate {rate:.2f})"
    return f"{row.stats.auc:.3f} [{row.stats.auc_lower_bound():.3f}] (n {n}, rate {rate:.2f})"
