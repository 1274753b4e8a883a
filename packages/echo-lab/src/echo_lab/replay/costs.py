"""Step-cost models for replay: the seconds one decode step costs on a named machine.

A step over B requests that drafts ``calls`` depths, expanding ``expansions`` nodes (or roots) in
all, and verifies ``rows = B + verified`` rows costs

    t = t_draft(B, calls, expansions) + t_verify(B, rows)

(scheduling, acceptance and commit are left out: they are engine overheads, not the model's).

**Profiled** (:class:`ProfiledCost`, the dev CPU): measured by ``scripts/measure_cpu_cost.py``
with the engine's own forward passes. ``t_verify(B, rows)`` interpolates the verify passes timed
at that batch size (B requests, each a context plus a chain of draft rows) piecewise-linearly in
``rows`` (:class:`~echo_scheduler.cost.ProfileCost`); ``t_draft = c_call * calls + c_node *
expansions`` is the least-squares fit of the drafter's timed calls (measured at batch 1: the
CPU head's cost is its rows, not its small KV cache). Only measured batch sizes can be
replayed.

**Measured GPU** (also :class:`ProfiledCost`): the same file format written by
``scripts/gpu_check`` (part ``cost-triton``) from a Llama-3.1-8B-shaped verify pass and an
EAGLE-3-shaped head on the device, in CUDA graphs; its ``draft_by_batch`` gives ``c_call`` and
``c_node`` per batch size (a GPU head call reads the batch's draft KV cache, so its cost grows
with B), used instead of the scalar fit at those sizes.

**Roofline** (:class:`RooflineCost`, H100/H200): ``t_verify = base + s_cmp max(0, rows - T0) +
t_comm(rows)`` with the hinge of :meth:`~echo_scheduler.cost.VerifyCostModel.roofline` (weights
and the batch's KV cache read once; compute-bound past the knee) and, under tensor parallelism
over p devices, the bandwidth term of a ring all-reduce per collective:

    t_comm(rows) = n_coll * 2 (p - 1) / p * rows * hidden * 2 bytes / (link_bw * link_eff)

(``n_coll`` = 2 per layer: after attention and after the MLP/MoE). The per-collective latency
is left out: for the target it adds the same seconds to every arm's step; for the draft head
(two collectives per call) leaving it out favours arms that make more drafter calls, a bias
towards ECHO's deeper drafting that is small next to a call's weight read. Drafting is the
roofline of the draft head: ``c_call(B) = (head bytes + B * context * head KV bytes per token)
/ p / (bw * eff)`` per depth (its weights and the batch's draft KV cache, read once per call)
and ``c_node = 2 * head params / p / (flops * eff)`` plus the head's own two collectives per
node row.

Published figures used (each with its source in :data:`SOURCES`): the datasheets of H100 SXM5
and H200 SXM (:class:`~echo_scheduler.cost.Hardware`), the Hugging Face configs of
Llama-3.1-8B-Instruct (32 layers, hidden 4,096, 8 KV heads x 128) and Qwen3-235B-A22B (94
layers, hidden 4,096, 4 KV heads x 128, 235e9 / 22e9 parameters), and the EAGLE-3 head for
Llama-3.1-8B (one decoder layer whose attention reads 2 x 4,096 inputs, MLP 14,336, a 3 x 4,096
-> 4,096 fusion layer and a 32,000-token draft vocabulary: 0.425e9 parameters, 0.85 GB bf16;
8 KV heads x 128 in one layer: 4 KiB of draft KV cache per token). The Qwen3 head is assumed
to have the same shapes (hidden 4,096), on the same TP 8 as its target.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from echo_scheduler.cost import (
    Hardware,
    LatencyModel,
    ModelGeometry,
    ProfileCost,
    VerifyCostModel,
)
from echo_scheduler.errors import CostModelError

CPU_COST_FORMAT = "echo-cpu-cost/1"
CONTEXT = 1024
"""Mean context of the roofline batches (B = 256 at 1,024 tokens fits 80 GB for both models)."""
EAGLE3_HEAD_KV_BYTES = 1 * 8 * 128 * 2 * 2
"""Draft KV cache per context token: one layer x 8 KV heads x 128 dims x (K, V) x 2 bytes."""
EAGLE3_HEAD_PARAMS = 0.425e9
"""EAGLE-3 head at hidden 4,096: q 8192x4096 + k, v 8192x1024 + o 4096x4096 + MLP 3x4096x14336 +
fusion 12288x4096 + draft lm_head 4096x32000 (module docstring)."""

SOURCES = {
    "H100 SXM5": "NVIDIA H100 datasheet: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, NVLink 900 GB/s",
    "H200 SXM": "NVIDIA H200 datasheet: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, NVLink 900 GB/s",
    "Llama-3.1-8B": "meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, hidden 4096, "
    "8 KV heads x 128; 8.0e9 parameters",
    "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B config.json: 94 layers, hidden 4096, 4 KV heads x "
    "128; 235e9 total / 22e9 active parameters",
    "EAGLE-3 head": "EAGLE-3 (Li et al., 2025) Llama-3.1-8B head: 1 decoder layer, 32k draft "
    "vocabulary; 0.425e9 parameters by its shapes",
    "efficiencies": "0.6 of peak FLOP/s, 0.8 of HBM and NVLink bandwidth: conventional roofline "
    "derating, the same for every arm",
}


class StepCost(Protocol):
    """Seconds of one step's drafting and verification (module docstring)."""

    @property
    def name(self) -> str: ...

    def verify_model(self, batch: int) -> LatencyModel:
        """Verify seconds over rows at batch size ``batch``, as a latency model."""
        ...

    def verify_s(self, batch: int, rows: float) -> float: ...

    def draft_s(self, batch: int, calls: int, expansions: int) -> float: ...

    def describe(self) -> dict[str, Any]: ...


@functools.lru_cache(maxsize=256)
def _roofline(
    hardware: Hardware, geometry: ModelGeometry, batch: int, context: int, comm_s_per_row: float
) -> VerifyCostModel:
    """The roofline hinge with the collectives as its memory slope, ``base + t_comm/row * rows
    + s_cmp max(0, rows - T0)``; built once per (device, model, batch, context), since replay
    prices every step's rows through it."""
    hinge = VerifyCostModel.roofline(hardware, geometry, batch, context)
    return VerifyCostModel(hinge.base_s, comm_s_per_row, hinge.slope_compute_s, hinge.knee_tokens)


@dataclass(frozen=True, slots=True)
class RooflineCost:
    """Roofline verify + collectives, roofline draft head (module docstring)."""

    name: str
    hardware: Hardware
    geometry: ModelGeometry  # per device
    hidden: int
    layers: int
    tensor_parallel: int = 1
    draft_params: float = EAGLE3_HEAD_PARAMS
    draft_kv_bytes_per_token: float = EAGLE3_HEAD_KV_BYTES
    context: int = CONTEXT

    def _comm_s_per_row(self) -> float:
        p = self.tensor_parallel
        if p <= 1:
            return 0.0
        ring = 2.0 * (p - 1) / p
        link = self.hardware.link_bandwidth * self.hardware.link_efficiency
        return 2 * self.layers * ring * self.hidden * 2 / link

    def verify_model(self, batch: int) -> VerifyCostModel:
        return _roofline(self.hardware, self.geometry, batch, self.context, self._comm_s_per_row())

    def verify_s(self, batch: int, rows: float) -> float:
        return self.verify_model(batch).latency_at(rows)

    def per_call_s(self, batch: int) -> float:
        """One drafter call: the head's bf16 weights (2 bytes per parameter) and the batch's
        draft KV cache, read once, over the derated bandwidth."""
        hw = self.hardware
        read = 2 * self.draft_params + batch * self.context * self.draft_kv_bytes_per_token
        return read / self.tensor_parallel / (hw.bandwidth * hw.bandwidth_efficiency)

    @property
    def per_node_s(self) -> float:
        hw, p = self.hardware, self.tensor_parallel
        head_comm = self._comm_s_per_row() / self.layers if p > 1 else 0.0  # one layer's two
        return 2 * self.draft_params / p / (hw.flops * hw.flops_efficiency) + head_comm

    def draft_s(self, batch: int, calls: int, expansions: int) -> float:
        return calls * self.per_call_s(batch) + expansions * self.per_node_s

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "roofline",
            "tensor_parallel": self.tensor_parallel,
            "context": self.context,
            "knee_rows_at_batch_256": round(
                VerifyCostModel.roofline(
                    self.hardware, self.geometry, 256, self.context
                ).knee_tokens,
                1,
            ),
            "comm_us_per_row": round(1e6 * self._comm_s_per_row(), 3),
            "draft_per_call_ms_at_batch_1": round(1e3 * self.per_call_s(1), 4),
            "draft_per_call_ms_at_batch_256": round(1e3 * self.per_call_s(256), 4),
            "draft_per_node_us": round(1e6 * self.per_node_s, 4),
        }


@dataclass(frozen=True, slots=True)
class ProfiledCost:
    """Measured verify passes per batch size and a fitted drafter (module docstring)."""

    name: str
    verify: Mapping[int, ProfileCost]  # batch size -> seconds over rows
    per_call_s: float
    per_node_s: float
    machine: Mapping[str, Any]
    draft_by_batch: Mapping[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """batch size -> (c_call, c_node) where measured per batch; else the scalar pair."""

    def verify_model(self, batch: int) -> ProfileCost:
        profile = self.verify.get(batch)
        if profile is None:
            raise CostModelError(
                f"{self.name}: batch size {batch} was not measured (measured: "
                f"{sorted(self.verify)}); re-measure with it (scripts/measure_cpu_cost.py for "
                "the CPU, scripts/gpu_check.sh --parts cost-triton on a GPU)"
            )
        return profile

    def verify_s(self, batch: int, rows: float) -> float:
        return self.verify_model(batch).latency_at(rows)

    def draft_s(self, batch: int, calls: int, expansions: int) -> float:
        per_call, per_node = self.draft_by_batch.get(batch, (self.per_call_s, self.per_node_s))
        return calls * per_call + expansions * per_node

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.verify))

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "profiled",
            "machine": dict(self.machine),
            "batch_sizes": list(self.batch_sizes),
            "verify_ms": {
                str(b): [round(1e3 * s, 3) for s in p.seconds] for b, p in self.verify.items()
            },
            "verify_rows": {str(b): list(p.tokens) for b, p in self.verify.items()},
            "draft_per_call_ms": round(1e3 * self.per_call_s, 4),
            "draft_per_node_ms": round(1e3 * self.per_node_s, 4),
            "draft_by_batch_ms": {
                str(b): [round(1e3 * c, 4), round(1e3 * n, 5)]
                for b, (c, n) in sorted(self.draft_by_batch.items())
            },
        }


def roofline_costs() -> dict[str, RooflineCost]:
    """The four GPU cost models: {H100, H200} x {Llama-3.1-8B on 1, Qwen3-235B-A22B on TP 8}."""
    out = {}
    for hw_name, hw in (("h100", Hardware.h100()), ("h200", Hardware.h200())):
        out[f"{hw_name}-llama8b"] = RooflineCost(
            f"{hw_name}-llama8b", hw, ModelGeometry.llama31_8b(), hidden=4096, layers=32
        )
        out[f"{hw_name}-qwen235b-tp8"] = RooflineCost(
            f"{hw_name}-qwen235b-tp8",
            hw,
            ModelGeometry.qwen3_235b_a22b(devices=8),
            hidden=4096,
            layers=94,
            tensor_parallel=8,
        )
    return out


def load_profiled(path: str | Path, name: str = "cpu") -> ProfiledCost:
    """A :class:`ProfiledCost` from an ``echo-cpu-cost/1`` JSON file (clear error if corrupt)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CostModelError(f"{path}: cannot read a {CPU_COST_FORMAT} file: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != CPU_COST_FORMAT:
        raise CostModelError(f"{path}: not a {CPU_COST_FORMAT} file")
    try:
        verify = {
            int(b): ProfileCost(
                tuple(float(t) for t in v["rows"]), tuple(float(s) for s in v["seconds"])
            )
            for b, v in data["verify"].items()
        }
        per_call, per_node = float(data["draft"]["per_call_s"]), float(data["draft"]["per_node_s"])
        machine = dict(data.get("machine", {}))
        by_batch = {
            int(b): (float(d["per_call_s"]), float(d["per_node_s"]))
            for b, d in data.get("draft_by_batch", {}).items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CostModelError(f"{path}: malformed {CPU_COST_FORMAT} file: {exc}") from exc
    if not verify or any(b < 1 for b in verify):
        raise CostModelError(f"{path}: verify needs batch sizes >= 1")
    for b, profile in verify.items():  # the oracle bound needs more rows never to cost less
        if any(t2 < t1 for t1, t2 in zip(profile.seconds, profile.seconds[1:], strict=False)):
            raise CostModelError(f"{path}: verify seconds at batch {b} must not fall with rows")
    if by_batch and (min(by_batch) < 1 or not set(verify) <= set(by_batch)):
        raise CostModelError(
            f"{path}: draft_by_batch must hold batch sizes >= 1 covering every verify batch "
            f"(verify {sorted(verify)}, draft_by_batch {sorted(by_batch)})"
        )
    drafts = (per_call, per_node, *(x for pair in by_batch.values() for x in pair))
    if not all(math.isfinite(x) and x >= 0 for x in drafts):
        raise CostModelError(f"{path}: draft costs must be finite and >= 0")
    return ProfiledCost(name, verify, per_call, per_node, machine, by_batch)


def profile_document(
    verify: Mapping[int, tuple[Sequence[float], Sequence[float]]],
    per_call_s: float,
    per_node_s: float,
    machine: Mapping[str, Any],
    draft_by_batch: Mapping[int, tuple[float, float]] | None = None,
    measurement: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An ``echo-cpu-cost/1`` document: ``verify[B] = (rows, seconds)``, the scalar drafter
    pair, optionally ``draft_by_batch[B] = (c_call, c_node)`` and how it was measured."""
    doc: dict[str, Any] = {
        "format": CPU_COST_FORMAT,
        "machine": dict(machine),
        "verify": {
            str(b): {"rows": list(map(float, r)), "seconds": list(map(float, s))}
            for b, (r, s) in sorted(verify.items())
        },
        "draft": {"per_call_s": per_call_s, "per_node_s": per_node_s},
    }
    if draft_by_batch:
        doc["draft_by_batch"] = {
            str(b): {"per_call_s": c, "per_node_s": n}
            for b, (c, n) in sorted(draft_by_batch.items())
        }
    if measurement:
        doc["measurement"] = dict(measurement)
    return doc


def save_profiled(
    path: str | Path,
    verify: Mapping[int, tuple[Sequence[float], Sequence[float]]],
    per_call_s: float,
    per_node_s: float,
    machine: Mapping[str, Any],
    draft_by_batch: Mapping[int, tuple[float, float]] | None = None,
) -> None:
    """Write :func:`profile_document` to ``path``."""
    doc = profile_document(verify, per_call_s, per_node_s, machine, draft_by_batch)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
