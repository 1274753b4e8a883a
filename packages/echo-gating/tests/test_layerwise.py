"""Layer-wise separation per gate label (echo_gating.layerwise): hand-computed cases and the
synthetic model, whose depths are independent given acceptance."""

from __future__ import annotations

import math

import torch

from echo_gating.layerwise import LABEL_RULES, layerwise_markdown, layerwise_separation
from echo_gating.records import GateSamples, gate_samples
from echo_gating.testing import SyntheticSpec, synthetic_records


def _samples() -> GateSamples:
    # three (request, step) pairs drafted to depth 3: accepted lengths 2, 0 and 1
    return GateSamples(
        depth=torch.tensor([1, 2, 3, 1, 2, 3, 1, 2, 3]),
        confidence=torch.tensor([0.9, 0.8, 0.3, 0.2, 0.1, 0.1, 0.9, 0.5, 0.1]),
        accepted=torch.tensor([True, True, False, False, False, False, True, False, False]),
        request_id=torch.tensor([7, 7, 7, 8, 8, 8, 9, 9, 9]),
        step=torch.zeros(9, dtype=torch.int64),
    )


def test_hand_computed_cells() -> None:
    rows = {(r.stats.depth, r.rule): r for r in layerwise_separation(_samples(), 3)}
    assert [(r.stats.depth, r.rule) for r in layerwise_separation(_samples(), 3)][:3] == [
        (1, rule) for rule in LABEL_RULES
    ]
    # depth 1, L >= 1: accepted {0.9, 0.9} against {0.2}
    reached = rows[1, "reached"].stats
    assert (reached.count, reached.accepted, reached.auc) == (3, 2, 1.0)
    # depth 1, L >= 2: {0.9} against {0.2, 0.9}: (1 + 1/2) / 2
    nxt = rows[1, "next"].stats
    assert (nxt.count, nxt.accepted, nxt.auc) == (3, 1, 0.75)
    # depth 1 given L >= 1: requests 7 (continues) and 9 (stops), both at 0.9: a tie
    cond = rows[1, "conditional"].stats
    assert (cond.count, cond.accepted, cond.auc) == (2, 1, 0.5)
    assert rows[1, "conditional"].positive_rate == 0.5
    # depth 2 given L >= 2: request 7 alone, and it stops: one class, no AUC
    only = rows[2, "conditional"].stats
    assert (only.count, only.accepted) == (1, 0)
    assert math.isnan(only.auc)
    assert math.isnan(only.auc_lower_bound())
    # the deepest recorded depth has no next label
    assert rows[3, "next"].stats.count == 0
    assert rows[3, "conditional"].stats.count == 0
    assert rows[1, "next"].stats.auc_lower_bound() < 0.75  # Hanley-McNeil: SE > 0 below 1


def test_markdown_lists_every_depth_and_rule() -> None:
    table = layerwise_markdown(layerwise_separation(_samples(), 3)).splitlines()
    assert table[0] == "| depth | reached | next | conditional |"
    assert len(table) == 2 + 3
    assert table[2].startswith("| 1 | 1.000 [")
    assert "0.750 [" in table[2]
    assert "(n 3, rate 0.33)" in table[2]
    assert table[3].endswith("- (n 1, rate 0.00) |")  # depth 2 conditional: one class
    assert table[4].endswith("| - | - |")  # depth 3: no next label


def test_unconditional_auc_sees_arrival_the_conditional_one_sees_continuation() -> None:
    """In the synthetic model a depth's confidence is drawn from its own acceptance only, so it
    says nothing about the next depth given this one: the conditional AUC is 0.5 at every
    depth (within 4 standard errors) while the unconditional one is above 0.9 at depths 1-3."""
    spec = SyntheticSpec()
    samples = gate_samples(synthetic_records(spec, torch.Generator().manual_seed(0), 500, 4))
    rows = {(r.stats.depth, r.rule): r.stats for r in layerwise_separation(samples, 5)}
    for d in (1, 2, 3):
        assert rows[d, "reached"].auc > 0.9
    for d in range(1, 6):
        cond = rows[d, "conditional"]
        half_width = cond.auc - cond.auc_lower_bound()  # 1.96 SE
        assert abs(cond.auc - 0.5) < 2 * half_width, (d, cond)
