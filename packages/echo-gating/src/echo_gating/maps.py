"""Calibrated acceptance maps: per depth, a monotone map from a log-score to P(accepted).

For depth d the map estimates ``m_d(s) = P(node accepted | depth d, path_logprob s)``. It is a
step function: bin edges ``e_1 < ... < e_{K-1}`` and values ``v_1 <= ... <= v_K``;
``m_d(s) = v_{k+1}`` where ``k = #{j: e_j <= s}``. Fitting (``fit_depth_map``):

1. pre-bin the scores into at most ``max_bins`` quantile bins (tied scores share a bin);
2. pool-adjacent-violators (isotonic regression, weights = bin counts) on the bins' empirical
   acceptance rates, merging neighbours until the rates strictly increase;
3. each merged block is one step: ``v_k = accepted_k / count_k``.

Because of step 2 every map is non-decreasing in s, so ranking candidates by ``m_d`` never
prefers a child over its parent at the same depth. Depths beyond the calibrated range use the
deepest map (and depth < 1 the first); lookup is one ``searchsorted`` over every depth's edges
(:meth:`AcceptanceMaps.expected_accept`).

Worked example: scores ``[-3, -2, -1, -0.5]`` with accepted ``[0, 1, 0, 1]`` and 4 bins give the
rates ``0, 1, 0, 1``; PAV merges the violating pair ``(1, 0)`` into 0.5, so the map is
``edges = (-2, -0.5)``, ``values = (0, 0.5, 1)``: ``m(-2.5) = 0``, ``m(-1.5) = 0.5``, ``m(0) = 1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from echo_gating.errors import CalibrationError, GatingError


@dataclass(frozen=True, slots=True)
class DepthMap:
    """One depth's monotone step function (see the module docstring)."""

    edges: tuple[float, ...]  # K-1 finite, strictly increasing
    values: tuple[float, ...]  # K in [0, 1], non-decreasing
    counts: tuple[int, ...]  # K samples behind each value

    def __post_init__(self) -> None:
        k = len(self.values)
        if k < 1 or len(self.edges) != k - 1 or len(self.counts) != k:
            raise CalibrationError(
                f"a depth map needs K >= 1 values, K-1 edges and K counts; got "
                f"{k} values, {len(self.edges)} edges, {len(self.counts)} counts"
            )
        if not all(math.isfinite(e) for e in self.edges) or any(
            b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)
        ):
            raise CalibrationError(f"map edges must be finite and increasing, got {self.edges}")
        if not all(0.0 <= v <= 1.0 for v in self.values) or any(
            b < a for a, b in zip(self.values, self.values[1:], strict=False)
        ):
            raise CalibrationError(
                f"map values must be non-decreasing in [0, 1], got {self.values}"
            )
        if any(c < 0 for c in self.counts):
            raise CalibrationError(f"map counts must be >= 0, got {self.counts}")

    def __call__(self, score: float) -> float:
        """The map at one score (a scalar convenience; use AcceptanceMaps for batches)."""
        return self.values[sum(1 for e in self.edges if e <= score)]


def _ordered(x: Tensor) -> Tensor:
    """[N] float32 -> [N] int64 in [0, 2^32), ordered as the floats are under ``<=`` (``-0.0``
    counts as ``+0.0``; NaN has no place): ``bits + 2^31`` for a clear sign bit, else
    ``-1 - bits``."""
    bits = (x + 0.0).view(torch.int32).to(torch.int64)  # + 0.0 turns -0.0 into +0.0
    return torch.where(bits >= 0, bits + (1 << 31), -1 - bits)


@dataclass(frozen=True, slots=True)
class _Tables:
    """Every depth's edges and values, flattened (:meth:`AcceptanceMaps.expected_accept`)."""

    flat_edges: Tensor  # [sum K_d - 1] int64, r 2^32 + o(e), ascending
    row_base: Tensor  # [D + 1] int64, r 2^32
    shift: Tensor  # [D + 1] int64, first value index of row r less its first edge index
    flat_values: Tensor  # [sum K_d] float32, row after row
    shifts: tuple[int, ...]  # ``shift`` on the host
    edges: tuple[Tensor, ...]  # depth d's edges, [K_d - 1] float32, at index d - 1
    values: tuple[Tensor, ...]  # depth d's values, [K_d] float32, at index d - 1


def _lookup(t: _Tables, x: Tensor, base: Tensor | int, shift: Tensor | int) -> Tensor:
    """The maps' values at the [N] scores ``x`` of rows with ``base`` (r 2^32) and ``shift``
    (either per element or one for all): :meth:`AcceptanceMaps.expected_accept`'s lookup."""
    query = _ordered(x.to(torch.float32)) + base
    at = torch.searchsorted(t.flat_edges, query, right=True)
    return t.flat_values.index_select(0, at + shift)


@dataclass(frozen=True, slots=True)
class AcceptanceMaps:
    """Per-depth acceptance maps; ``maps[d - 1]`` serves depth d."""

    maps: tuple[DepthMap, ...]
    _tables: dict[str, _Tables] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.maps:
            raise CalibrationError("acceptance maps need at least one depth")

    @property
    def max_depth(self) -> int:
        return len(self.maps)

    def expected_accept(self, depth: Tensor, path_logprob: Tensor) -> Tensor:
        """``m_depth(path_logprob)``: [N] int64, [N] float -> [N] float32 in [0, 1].

        One ``searchsorted`` over every depth's edges at once, without an [N, K] table: a float32
        ``x`` becomes the int64 ``o(x) = bits(x) + 2^31`` when its sign bit is clear, else
        ``-1 - bits(x)`` (``bits``: the sign-extended int32 pattern), which orders floats as
        ``<=`` does once ``-0.0`` is made ``+0.0``; depth row r's edges are stored as
        ``r 2^32 + o(e)``, sorted, so the edges of row r up to ``x`` are those up to
        ``r 2^32 + o(x)`` less the ``r`` rows before: exactly ``#{j: e_j <= x}``.
        """
        if depth.dim() != 1 or depth.dtype != torch.int64 or path_logprob.shape != depth.shape:
            raise GatingError(
                f"depth must be [N] int64 and path_logprob [N], got {tuple(depth.shape)} "
                f"{depth.dtype} and {tuple(path_logprob.shape)}"
            )
        t = self._device_tables(depth.device)
        row = depth.clamp(1, self.max_depth)  # tables carry an unused row 0
        return _lookup(
            t, path_logprob, t.row_base.index_select(0, row), t.shift.index_select(0, row)
        )

    def expected_accept_at(self, depth: int, path_logprob: Tensor) -> Tensor:
        """``m_depth(path_logprob)`` at one depth for every element: any shape float ->
        float32 of that shape. With the depth fixed by the caller's code, not by data, the
        lookup needs no row encoding: ``searchsorted`` over that depth's float32 edges
        (``right``: ``#{j: e_j <= x}``; float ``<=`` already counts ``-0.0`` as ``+0.0``) and
        one gather, the same values as :meth:`expected_accept` in fewer ops. NaN has no place
        in either (a path log-prob is never NaN): here every NaN takes the last value, there
        a NaN with its sign bit set takes the first."""
        t = self._device_tables(path_logprob.device)
        row = min(max(depth, 1), self.max_depth) - 1
        x = path_logprob.to(torch.float32).reshape(-1)
        at = torch.searchsorted(t.edges[row], x, right=True)
        return t.values[row].index_select(0, at).view(path_logprob.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "depths": [
                {
                    "depth": d,
                    "edges": list(m.edges),
                    "values": list(m.values),
                    "counts": list(m.counts),
                }
                for d, m in enumerate(self.maps, start=1)
            ]
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptanceMaps:
        """Inverse of :meth:`to_dict`; raises CalibrationError naming the first problem."""
        depths = data.get("depths") if isinstance(data, Mapping) else None
        if not isinstance(depths, list):
            raise CalibrationError("acceptance_maps.depths must be a list")
        maps: list[DepthMap] = []
        for i, item in enumerate(depths, start=1):
            if not isinstance(item, Mapping) or item.get("depth") != i:
                raise CalibrationError(f"acceptance_maps.depths[{i - 1}] must have depth {i}")
            for key in ("edges", "values", "counts"):
                if not isinstance(item.get(key), list):
                    raise CalibrationError(f"acceptance map of depth {i}: {key} must be a list")
            if not all(isinstance(c, int) and not isinstance(c, bool) for c in item["counts"]):
                raise CalibrationError(f"acceptance map of depth {i}: counts must be integers")
            try:
                maps.append(
                    DepthMap(
                        edges=tuple(float(e) for e in item["edges"]),
                        values=tuple(float(v) for v in item["values"]),
                        counts=tuple(item["counts"]),
                    )
                )
            except (TypeError, ValueError) as exc:
                raise CalibrationError(f"acceptance map of depth {i}: {exc}") from exc
        return cls(tuple(maps))

    def _device_tables(self, device: torch.device) -> _Tables:
        key = str(device)
        if key not in self._tables:
            keys: list[Tensor] = []
            edge_start, value_start = [0], [0]
            for r, m in enumerate(self.maps, start=1):
                edges = torch.tensor(m.edges, dtype=torch.float32).reshape(-1)
                keys.append(_ordered(edges) + (r << 32))
                edge_start.append(edge_start[-1] + len(m.edges))
                value_start.append(value_start[-1] + len(m.values))
            rows = torch.arange(self.max_depth + 1, dtype=torch.int64)
            # the searchsorted position counts every earlier row's edges; shift moves it to the
            # row's own values: shift_r = value_start_r - edge_start_r
            shifts = (0, *(v - e for v, e in zip(value_start[:-1], edge_start[:-1], strict=True)))
            values = [v for m in self.maps for v in m.values]

            def on_device(xs: tuple[float, ...]) -> Tensor:
                return torch.tensor(xs, dtype=torch.float32).reshape(-1).to(device)

            self._tables[key] = _Tables(
                flat_edges=torch.cat(keys).to(device),
                row_base=(rows << 32).to(device),
                shift=torch.tensor(shifts, dtype=torch.int64).to(device),
                shifts=shifts,
                flat_values=torch.tensor(values, dtype=torch.float32).to(device),
                edges=tuple(on_device(m.edges) for m in self.maps),
                values=tuple(on_device(m.values) for m in self.maps),
            )
        return self._tables[key]


def fit_depth_map(scores: Tensor, accepted: Tensor, max_bins: int = 64) -> DepthMap:
    """Isotonic map of ``accepted`` ([n] bool) on ``scores`` ([n] float, no NaN, n >= 1)."""
    if scores.dim() != 1 or accepted.shape != scores.shape or accepted.dtype != torch.bool:
        raise GatingError(
            f"scores must be [n] and accepted [n] bool, got {tuple(scores.shape)}, "
            f"{tuple(accepted.shape)} {accepted.dtype}"
        )
    if scores.numel() == 0 or max_bins < 1:
        raise GatingError(f"need n >= 1 scores and max_bins >= 1, got {scores.numel()}, {max_bins}")
    s = scores.detach().to(device="cpu", dtype=torch.float32)
    if bool(torch.isnan(s).any() | (s == math.inf).any()):
        raise GatingError("scores must not contain NaN or +inf")
    y = accepted.detach().cpu().to(torch.float64)
    ordered = torch.sort(s).values
    n = ordered.numel()
    cut = ordered[(torch.arange(1, max_bins) * n) // max_bins]
    cut = torch.unique(cut[cut > ordered[0]])  # every bin below/between cuts is non-empty
    bins = torch.searchsorted(cut, s, right=True)
    count = torch.bincount(bins, minlength=cut.numel() + 1).tolist()
    hits = torch.bincount(bins, weights=y, minlength=cut.numel() + 1).tolist()
    blocks = _pool_adjacent_violators(hits, count)
    return DepthMap(
        edges=tuple(float(cut[first - 1]) for first, _, _ in blocks[1:]),
        values=tuple(h / c for _, h, c in blocks),
        counts=tuple(int(c) for _, _, c in blocks),
    )


def fit_acceptance_maps(
    depth: Tensor, score: Tensor, accepted: Tensor, max_bins: int = 64, min_samples: int = 20
) -> AcceptanceMaps:
    """One map per depth 1..max(depth): [n] int64, [n] float, [n] bool -> AcceptanceMaps.

    A depth with fewer than ``min_samples`` samples reuses the nearest shallower fitted map (the
    nearest deeper one if there is none shallower).
    """
    if depth.numel() == 0:
        raise GatingError("cannot fit acceptance maps from zero samples")
    deepest = int(depth.max())
    fitted: dict[int, DepthMap] = {}
    for d in range(1, deepest + 1):
        mask = depth == d
        if int(mask.sum()) >= max(min_samples, 1):
            fitted[d] = fit_depth_map(score[mask], accepted[mask], max_bins)
    if not fitted:
        raise GatingError(f"no depth has the {min_samples} samples a map needs")
    return AcceptanceMaps(tuple(fitted[_nearest(d, fitted)] for d in range(1, deepest + 1)))


def _nearest(d: int, fitted: Mapping[int, DepthMap]) -> int:
    shallower = [k for k in fitted if k <= d]
    return max(shallower) if shallower else min(fitted)


def _pool_adjacent_violators(
    hits: Sequence[float], count: Sequence[int]
) -> list[tuple[int, float, int]]:
    """Blocks ``(first_bin, hits, count)`` with strictly increasing rates ``hits / count``."""
    blocks: list[tuple[int, float, int]] = []
    for k, (h, c) in enumerate(zip(hits, count, strict=True)):
        if c == 0:
            continue
        first, acc_h, acc_c = k, float(h), int(c)
        while blocks and blocks[-1][1] * acc_c >= acc_h * blocks[-1][2]:
            first, prev_h, prev_c = blocks.pop()
            acc_h, acc_c = acc_h + prev_h, acc_c + prev_c
        blocks.append((first, acc_h, acc_c))
    return blocks
