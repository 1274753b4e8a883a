"""Gates chosen by simulated net utility instead of by AUC: the ``echo_utility`` arm.

Calibration by separation (:mod:`echo_gating.calibrate`) asks whether a signal ranks requests
well at a depth; what pays is whether truncating there makes the step faster once the key, the
exact cut, the floor and the full drafting cost (per call and per expanded node) have done their
part. So per (trace, cost model, batch size B) the gate is chosen by driving ECHO itself.

Candidates: no checkpoint (``echo_nogate``: acceptance maps and the floor only), and one
checkpoint ``{d: tau}`` for every signal ``s`` of :data:`UTILITY_SIGNALS` (``layer_confidence``,
which the key already bounds, and ``sibling_margin``, which it does not), depth ``d`` of
:data:`UTILITY_DEPTHS` and truncation share ``q`` of :data:`UTILITY_SHARES`, where ``tau`` is
the ``q``-quantile of ``s`` at depth ``d`` over the tuning steps' recorded pools (requests that
drafted depth ``d``). Every candidate keeps ``echo_nogate``'s acceptance maps: the key, the cut
and the floor are the same; only the truncation differs.

Choice: each candidate drives ECHO, its floor fed by the cell's cost model, through the tuning
steps: batches of B composed from the *warm-up* rows, never from the evaluation rows. Its rate
is ``sum_i (B + a_i) / sum_i t_i``; the winner is the fastest, and a checkpoint must beat no
checkpoint by more than :data:`MIN_GAIN` (a relative margin) to be chosen. The arm's row on the
evaluation steps is therefore an out-of-sample test of the choice; ``gate_choice`` names it and
``tuning_gain`` is its tuning rate over no checkpoint's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from echo_gating.policy import GateMode, GatePolicy
from echo_gating.signals import GATE_SIGNALS, gate_signal
from echo_lab.sim.trace import RecordedStep

UTILITY_SIGNALS = tuple(GATE_SIGNALS)  # layer_confidence, sibling_margin
UTILITY_DEPTHS = (1, 2)
UTILITY_SHARES = (0.25, 0.5)
"""Grid of 1 + 2 x 2 x 2 = 9 candidates: depth 3 was tried (13 candidates) and chosen in 3 of 45
cells, each with a tuning gain under 1%, for 90 s more replay time (past the 3-minute budget)."""
MIN_GAIN = 0.005
"""A checkpoint is chosen only if its tuning rate beats no checkpoint's by more than 0.5%."""


@dataclass(frozen=True, slots=True)
class GateChoice:
    """The chosen gate and why."""

    gate: GatePolicy
    label: str  # "none" or "<signal>@<d>:q=<share>"
    gain: float  # tuning rate of the choice / tuning rate without a checkpoint
    rates: dict[str, float]  # label -> tuning rate, every candidate


def candidate_gates(nogate: GatePolicy, tuning: Sequence[RecordedStep]) -> dict[str, GatePolicy]:
    """The candidate set of the module docstring, keyed by label (``"none"`` first)."""
    out = {"none": nogate}
    for signal in UTILITY_SIGNALS:
        for d in UTILITY_DEPTHS:
            values = _values(tuning, d, signal)
            if values.numel() == 0:
                continue
            for q in UTILITY_SHARES:
                tau = float(torch.quantile(values, q))
                out[f"{signal}@{d}:q={q:g}"] = replace(
                    nogate,
                    version=f"{nogate.version}+{signal}@{d}:{tau:.4g}",
                    mode=GateMode.SPARSE,
                    thresholds={d: min(max(tau, 0.0), 1.0)},
                    signal=signal,
                )
    return out


def choose_gate(
    candidates: dict[str, GatePolicy], rate: Callable[[GatePolicy], float]
) -> GateChoice:
    """The fastest candidate by ``rate`` (tokens/s on the tuning steps), module docstring rule."""
    rates = {label: rate(gate) for label, gate in candidates.items()}
    base = rates["none"]
    label = max(rates, key=lambda k: (rates[k], k == "none"))
    if label != "none" and rates[label] <= base * (1.0 + MIN_GAIN):
        label = "none"
    return GateChoice(candidates[label], label, rates[label] / base if base > 0 else 1.0, rates)


def _values(steps: Sequence[RecordedStep], depth: int, signal: str) -> torch.Tensor:
    """``signal`` at ``depth`` of every request that drafted that deep, over ``steps``."""
    parts = []
    for st in steps:
        reached = torch.zeros(st.batch_size, dtype=torch.bool)
        reached[st.pool.request_index()[st.pool.depth == depth]] = True
        parts.append(gate_signal(st.pool, depth, signal)[reached])
    return torch.cat(parts) if parts else torch.zeros(0)
