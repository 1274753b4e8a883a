"""Warm-up records: per drafted node, its signals and whether the target accepted it.

One record per drafted node (columns, all [n], on the CPU):

=================  =======  ==========================================================
request_id         int64    the request (stable across its steps)
step               int64    the decode step of that request
depth              int64    node depth, >= 1 (root children = 1)
path_logprob       float32  log path score, sum of draft log-probs from the root (<= 0)
draft_logprob      float32  log q(token | ancestors) (<= 0)
layer_confidence   float32  the request's layer confidence at this depth, in [0, 1]
accepted           bool     the target accepted this node (it lies on the accepted path)
extra[name]        float32  optional further signals (draft entropy, top-2 margin, ...)
=================  =======  ==========================================================

plus ``meta`` (str -> str: target, drafter, sampling settings) that the calibrated policy
inherits. Warm-up should draft every request to the full depth without gating, so that each
depth sees accepted and rejected drafts alike.

Gate samples (:func:`gate_samples`) regroup the nodes per (request, step, depth): confidence
``C = max layer_confidence`` and label ``accepted = any node at that depth accepted`` (for a
tree the accepted path holds at most one node per depth, so the label is "accepted length >= d").

Worked example: a request with two depth-1 nodes (path probs 0.7 accepted, 0.2 rejected) gives
two node records, both with ``layer_confidence = 0.7``, and one gate sample ``(1, 0.7, True)``.
Files: :mod:`echo_gating.record_file` (``RecordSet.save`` / ``RecordSet.load``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.errors import CalibrationError
from echo_gating.signals import node_layer_confidence

RECORD_COLUMNS: dict[str, torch.dtype] = {
    "request_id": torch.int64,
    "step": torch.int64,
    "depth": torch.int64,
    "path_logprob": torch.float32,
    "draft_logprob": torch.float32,
    "layer_confidence": torch.float32,
    "accepted": torch.bool,
}
"""Required columns and their dtypes, in file order."""

LOGPROB_ATOL = 1e-4
"""Slack above 0 (and above 1 for probabilities) tolerated from float32 rounding."""

_EXTRA_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True, slots=True, eq=False)  # tensor fields: no elementwise __eq__
class GateSamples:
    """One sample per (request, step, depth): what a gate saw and whether it was right."""

    depth: Tensor  # [m] int64, >= 1
    confidence: Tensor  # [m] float32 layer confidence
    accepted: Tensor  # [m] bool, the request's depth-d token was accepted
    request_id: Tensor | None = None  # [m] int64, when known (gate_samples fills it)
    step: Tensor | None = None  # [m] int64

    def __len__(self) -> int:
        return int(self.depth.numel())

    def relabelled(self, rule: str) -> GateSamples:
        """The samples for a gate at depth d under label ``rule``:

        - ``reached``: accepted length >= d (as recorded);
        - ``next``: accepted length >= d + 1, the depths a truncation at d removes (samples at
          the deepest recorded depth of their (request, step) are dropped: unknown);
        - ``conditional``: ``next`` among the samples that reached d only (how well confidence
          separates, given the request got this far: the measure that sees drift).
        """
        if rule == "reached":
            return self
        if rule not in ("next", "conditional"):
            raise CalibrationError(f"unknown gate label rule {rule!r}")
        if self.request_id is None or self.step is None:
            raise CalibrationError("relabelling needs request ids and steps (use gate_samples)")
        if len(self) == 0:
            return self
        _, pair = torch.unique(
            torch.stack([self.request_id, self.step]), dim=1, return_inverse=True
        )
        key = pair * (int(self.depth.max()) + 2) + self.depth  # depth + 1 stays in the pair
        order = torch.argsort(key)
        sorted_key = key[order]
        at = torch.searchsorted(sorted_key, key + 1).clamp(max=max(len(self) - 1, 0))
        has_next = sorted_key[at] == key + 1
        nxt = self.accepted[order[at]] & has_next
        keep = has_next & (self.accepted if rule == "conditional" else torch.ones_like(has_next))
        return GateSamples(
            depth=self.depth[keep],
            confidence=self.confidence[keep],
            accepted=nxt[keep],
            request_id=self.request_id[keep],
            step=self.step[keep],
        )


@dataclass(frozen=True, slots=True, eq=False)  # tensor fields: no elementwise __eq__
class RecordSet:
    """A validated table of warm-up node records (see the module docstring)."""

    request_id: Tensor  # [n] int64
    step: Tensor  # [n] int64
    depth: Tensor  # [n] int64
    path_logprob: Tensor  # [n] float32
    draft_logprob: Tensor  # [n] float32
    layer_confidence: Tensor  # [n] float32
    accepted: Tensor  # [n] bool
    extra: Mapping[str, Tensor] = field(default_factory=dict)  # name -> [n] float32
    meta: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self)
        object.__setattr__(self, "extra", dict(sorted(self.extra.items())))
        object.__setattr__(self, "meta", dict(sorted(self.meta.items())))

    def __len__(self) -> int:
        return int(self.depth.numel())

    def columns(self) -> dict[str, Tensor]:
        """Required columns in file order, then the extra signals by name."""
        cols = {name: getattr(self, name) for name in RECORD_COLUMNS}
        cols.update({f"extra.{k}": v for k, v in self.extra.items()})
        return cols

    def select(self, mask: Tensor) -> RecordSet:
        """The records where ``mask`` ([n] bool) is true, e.g. a window of recent steps."""
        return RecordSet(
            **{name: getattr(self, name)[mask] for name in RECORD_COLUMNS},
            extra={k: v[mask] for k, v in self.extra.items()},
            meta=self.meta,
        )

    @classmethod
    def concat(cls, sets: Sequence[RecordSet]) -> RecordSet:
        """Concatenate record sets with identical extra columns and meta."""
        if not sets:
            raise CalibrationError("cannot concatenate zero record sets")
        first = sets[0]
        for other in sets[1:]:
            if set(other.extra) != set(first.extra) or dict(other.meta) != dict(first.meta):
                raise CalibrationError(
                    f"record sets disagree: extra {sorted(other.extra)} vs {sorted(first.extra)}, "
                    f"meta {dict(other.meta)} vs {dict(first.meta)}"
                )
        return cls(
            **{name: torch.cat([getattr(s, name) for s in sets]) for name in RECORD_COLUMNS},
            extra={k: torch.cat([s.extra[k] for s in sets]) for k in first.extra},
            meta=first.meta,
        )

    def save(self, path: str | Path) -> None:
        from echo_gating.record_file import save_records  # deferred: record_file imports us

        save_records(self, path)

    @classmethod
    def load(cls, path: str | Path) -> RecordSet:
        from echo_gating.record_file import load_records  # deferred: record_file imports us

        return load_records(path)


def gate_samples(records: RecordSet) -> GateSamples:
    """Group node records per (request, step, depth); order-independent (sorted by key)."""
    if len(records) == 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return GateSamples(empty, empty.to(torch.float32), empty.to(torch.bool))
    # Dense lexicographic rank of (request_id, step, depth), one 1-D unique per column: each
    # combined key is < n^2, so it cannot overflow int64 for any realistic n.
    group = torch.zeros_like(records.depth)
    for column in (records.request_id, records.step, records.depth):
        values, rank = torch.unique(column, return_inverse=True)
        _, group = torch.unique(group * values.numel() + rank, return_inverse=True)
    groups = int(group.max()) + 1
    depth = torch.zeros(groups, dtype=torch.int64).scatter_(0, group, records.depth)
    request = torch.zeros(groups, dtype=torch.int64).scatter_(0, group, records.request_id)
    step = torch.zeros(groups, dtype=torch.int64).scatter_(0, group, records.step)
    conf = torch.zeros(groups, dtype=torch.float32)
    conf.scatter_reduce_(0, group, records.layer_confidence, reduce="amax", include_self=False)
    hit = torch.zeros(groups, dtype=torch.int64)
    hit.scatter_reduce_(0, group, records.accepted.to(torch.int64), "amax", include_self=False)
    return GateSamples(
        depth=depth, confidence=conf, accepted=hit.bool(), request_id=request, step=step
    )


class RecordWriter:
    """Accumulates record batches during warm-up; :meth:`finish` concatenates and validates."""

    def __init__(self, meta: Mapping[str, str] | None = None) -> None:
        self._meta = dict(meta or {})
        self._parts: list[RecordSet] = []

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    def append(
        self,
        *,
        request_id: Tensor,  # [m] int64
        step: Tensor,  # [m] int64
        depth: Tensor,  # [m] int64
        path_logprob: Tensor,  # [m] float32
        draft_logprob: Tensor,  # [m] float32
        layer_confidence: Tensor,  # [m] float32
        accepted: Tensor,  # [m] bool
        extra: Mapping[str, Tensor] | None = None,  # name -> [m] float32
    ) -> None:
        """Append one batch of node records (moved to the CPU, validated now)."""
        self._parts.append(
            RecordSet(
                request_id=request_id.detach().cpu(),
                step=step.detach().cpu(),
                depth=depth.detach().cpu(),
                path_logprob=path_logprob.detach().cpu(),
                draft_logprob=draft_logprob.detach().cpu(),
                layer_confidence=layer_confidence.detach().cpu(),
                accepted=accepted.detach().cpu(),
                extra={k: v.detach().cpu() for k, v in (extra or {}).items()},
                meta=self._meta,
            )
        )

    def append_pool(
        self,
        pool: TreeBatch,
        accepted: Tensor,  # [N] bool, per pool node
        request_id: Tensor,  # [B] int64, per request
        step: Tensor,  # [B] int64, per request
        extra: Mapping[str, Tensor] | None = None,  # name -> [N] float32
    ) -> None:
        """Append every node of a verified candidate pool (what the engine logs per step)."""
        if accepted.shape != (pool.num_nodes,) or request_id.shape != (pool.batch_size,):
            raise CalibrationError(
                f"accepted must be [N={pool.num_nodes}] and request_id [B={pool.batch_size}], "
                f"got {tuple(accepted.shape)} and {tuple(request_id.shape)}"
            )
        if step.shape != (pool.batch_size,):
            raise CalibrationError(f"step must be [B={pool.batch_size}], got {tuple(step.shape)}")
        req = pool.request_index()
        self.append(
            request_id=request_id[req],
            step=step[req],
            depth=pool.depth,
            path_logprob=pool.path_logprob,
            draft_logprob=pool.draft_logprob,
            layer_confidence=node_layer_confidence(pool),
            accepted=accepted,
            extra=extra,
        )

    def finish(self) -> RecordSet:
        if not self._parts:
            raise CalibrationError("no records were appended")
        return RecordSet.concat(self._parts)


def _validate(r: RecordSet) -> None:
    n = int(r.depth.numel())
    cols = {name: getattr(r, name) for name in RECORD_COLUMNS}
    cols.update({f"extra.{k}": v for k, v in r.extra.items()})
    for name, t in cols.items():
        want = RECORD_COLUMNS.get(name, torch.float32)
        if not isinstance(t, Tensor) or t.dim() != 1 or t.numel() != n:
            raise CalibrationError(f"column {name!r} must be a [n={n}] tensor")
        if t.dtype != want:
            raise CalibrationError(f"column {name!r} has dtype {t.dtype}, expected {want}")
        if t.device.type != "cpu":
            raise CalibrationError(f"column {name!r} must live on the CPU, got {t.device}")
    for k in r.extra:
        if not _EXTRA_NAME.fullmatch(k) or k in RECORD_COLUMNS:
            raise CalibrationError(f"extra signal name {k!r} must be a new lower_snake_case name")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in r.meta.items()):
        raise CalibrationError(f"meta must map strings to strings, got {dict(r.meta)!r}")
    if n == 0:
        return
    checks = (
        ("depth", r.depth < 1, "depths start at 1"),
        ("path_logprob", ~(r.path_logprob <= LOGPROB_ATOL), "must be <= 0 and not NaN"),
        ("draft_logprob", ~(r.draft_logprob <= LOGPROB_ATOL), "must be <= 0 and not NaN"),
        (
            "layer_confidence",
            ~((r.layer_confidence >= 0) & (r.layer_confidence <= 1 + LOGPROB_ATOL)),
            "must lie in [0, 1]",
        ),
    )
    for name, bad, rule in checks:
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            value = getattr(r, name)[i].item()
            raise CalibrationError(f"record {i}: {name} = {value} ({rule})")
