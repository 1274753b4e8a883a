"""Online drift monitoring: is the live acceptance still what the calibration predicted?

Fed gate observations during serving: per request and drafted depth d, its layer confidence
``C_b(d)`` and whether its depth-d token was accepted (:func:`gate_observations` builds them
from a verified pool). Per depth the monitor keeps the last ``window`` observations (a ring
buffer) and reports, as plain numbers for metrics:

- realised acceptance ``r = mean(accepted)``; predicted ``p = mean(m_d(log C))`` from the
  policy's gate maps (else the calibration's acceptance rate); calibration error ``r - p``;
- the AUC of the gate in the window vs the calibration's reference AUC;
- the fraction of observations the policy truncates at each checkpoint (NaN when the policy
  gates on another signal than the layer confidence the monitor is fed).

Drift rule: every time a depth has collected ``window`` fresh observations, that window is
judged. It fails when ``|r - p| > z * sqrt(sum_i p_i (1 - p_i)) / n + tolerance`` (outside the
binomial confidence band around the prediction) or, at a checkpoint,
``AUC_live < AUC_ref - auc_drop``. ``patience`` consecutive failed windows of one depth advise
recalibration; a passing window resets that depth. The advice comes with a reason string
(SGLang style), e.g. ``depth 2: realised acceptance 0.412 vs predicted 0.620 (band +-0.061)
in 3 consecutive windows``.

Recalibrating without stopping: ``calibrate_gates(monitor.window(), config, ...)`` on the live
window (note that depths behind a truncating gate are only observed for confident requests, so
a window recalibration is biased towards them; warm-up records without gating are not).

Worked example: a policy calibrated with 70% acceptance at depth 2 now sees 45% over three
windows of 1024 (band about +-0.09): ``check().recalibrate`` is True with that depth's reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from echo_core.tree import TreeBatch
from echo_gating.errors import GatingError
from echo_gating.policy import GatePolicy
from echo_gating.records import GateSamples
from echo_gating.separation import auc
from echo_gating.signals import DEFAULT_SIGNAL, depth_confidences


@dataclass(frozen=True, slots=True)
class DriftConfig:
    window: int = 1024  # observations per depth per judged window
    min_samples: int = 100  # below this, check() reports values but no problem
    z: float = 3.0  # band half-width in binomial standard errors
    tolerance: float = 0.05  # absolute slack added to the band
    auc_drop: float = 0.10  # tolerated fall of a checkpoint's AUC
    patience: int = 3  # consecutive failed windows before advising recalibration

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_samples < 1 or self.patience < 1:
            raise GatingError(
                f"window, min_samples and patience must be >= 1, got {self.window}, "
                f"{self.min_samples}, {self.patience}"
            )


@dataclass(frozen=True, slots=True)
class DepthHealth:
    depth: int
    samples: int
    realised: float  # acceptance rate in the window
    predicted: float  # NaN without a calibrated prediction
    band: float  # allowed |realised - predicted|
    auc: float  # window AUC, NaN if a class is missing
    reference_auc: float  # NaN if unknown
    truncated: float  # fraction gated off at this checkpoint, NaN off-checkpoint
    strikes: int  # consecutive failed windows
    problem: str | None  # why the current window fails, None if it passes

    @property
    def calibration_error(self) -> float:
        return self.realised - self.predicted


@dataclass(frozen=True, slots=True)
class DriftReport:
    policy_version: str
    depths: tuple[DepthHealth, ...]
    recalibrate: bool
    reason: str | None  # None unless recalibrate

    def metrics(self) -> dict[str, float]:
        """Flat ``depth<d>.<name>`` values for a metrics exporter."""
        out: dict[str, float] = {"recalibrate": float(self.recalibrate)}
        for h in self.depths:
            for name in ("samples", "realised", "predicted", "auc", "truncated", "strikes"):
                out[f"depth{h.depth}.{name}"] = float(getattr(h, name))
            out[f"depth{h.depth}.calibration_error"] = h.calibration_error
        return out


class DriftMonitor:
    """Sliding-window calibration monitor for one policy (see the module docstring)."""

    def __init__(self, policy: GatePolicy, config: DriftConfig | None = None) -> None:
        self.policy = policy
        self.config = config or DriftConfig()
        depths, w = policy.max_depth, self.config.window
        self._conf = torch.zeros(depths, w, dtype=torch.float32)  # [D, W] ring buffers
        self._hit = torch.zeros(depths, w, dtype=torch.bool)  # [D, W]
        self._next = [0] * depths
        self._filled = [0] * depths
        self._fresh = [0] * depths
        self._strikes = [0] * depths
        self._last_problem: list[str | None] = [None] * depths

    def observe(self, depth: Tensor, confidence: Tensor, accepted: Tensor) -> None:
        """Add observations: [M] int64 depth, [M] float32 confidence, [M] bool accepted.

        Depths beyond the policy's ``max_depth`` are ignored.
        """
        if depth.dim() != 1 or confidence.shape != depth.shape or accepted.shape != depth.shape:
            raise GatingError(
                f"depth, confidence, accepted must all be [M], got {tuple(depth.shape)}, "
                f"{tuple(confidence.shape)}, {tuple(accepted.shape)}"
            )
        if accepted.dtype != torch.bool or depth.dtype != torch.int64:
            raise GatingError(
                f"need int64 depth and bool accepted, got {depth.dtype}, {accepted.dtype}"
            )
        depth, conf, hit = depth.cpu(), confidence.detach().cpu().float(), accepted.cpu()
        w = self.config.window
        for d in range(1, self.policy.max_depth + 1):
            mask = depth == d
            c, h = conf[mask][-w:], hit[mask][-w:]
            n = int(c.numel())
            if n == 0:
                continue
            i = d - 1
            slots = (self._next[i] + torch.arange(n)) % w
            self._conf[i, slots], self._hit[i, slots] = c, h
            self._next[i] = (self._next[i] + n) % w
            self._filled[i] = min(w, self._filled[i] + n)
            self._fresh[i] += int(mask.sum())
            if self._fresh[i] >= w:
                self._fresh[i] = 0
                problem = self._assess(d).problem
                self._strikes[i] = self._strikes[i] + 1 if problem else 0
                self._last_problem[i] = problem

    def window(self) -> GateSamples:
        """The observations currently in the windows, for a live recalibration."""
        parts = [
            (d + 1, self._conf[d, : self._filled[d]], self._hit[d, : self._filled[d]])
            for d in range(self.policy.max_depth)
        ]
        return GateSamples(
            depth=torch.cat([torch.full((c.numel(),), d, dtype=torch.int64) for d, c, _ in parts]),
            confidence=torch.cat([c for _, c, _ in parts]),
            accepted=torch.cat([h for _, _, h in parts]),
        )

    def check(self) -> DriftReport:
        """Current per-depth health and the recalibration advice."""
        health = tuple(
            self._assess(d) for d in range(1, self.policy.max_depth + 1) if self._filled[d - 1]
        )
        failing = [
            f"depth {d}: {self._last_problem[d - 1]} in {self._strikes[d - 1]} consecutive windows"
            for d in range(1, self.policy.max_depth + 1)
            if self._strikes[d - 1] >= self.config.patience
        ]
        return DriftReport(
            policy_version=self.policy.version,
            depths=health,
            recalibrate=bool(failing),
            reason="; ".join(failing) if failing else None,
        )

    def _assess(self, d: int) -> DepthHealth:
        cfg, i = self.config, d - 1
        conf, hit = self._conf[i, : self._filled[i]], self._hit[i, : self._filled[i]]
        n = int(conf.numel())
        realised = float(hit.float().mean())
        predicted, band = self._prediction(d, conf)
        ref = self.policy.reference.get(d)
        ref_auc = math.nan if ref is None or ref.auc is None else ref.auc
        live_auc = auc(conf, hit)
        checkpoint = self.policy.is_checkpoint(d)
        on_conf = checkpoint and self.policy.signal == DEFAULT_SIGNAL  # what it observes
        truncated = float((~self.policy.gate(d, conf)).float().mean()) if on_conf else math.nan
        problem = None
        if n >= cfg.min_samples and abs(realised - predicted) > band:
            problem = (
                f"realised acceptance {realised:.3f} vs predicted {predicted:.3f} "
                f"(band +-{band:.3f})"
            )
        elif n >= cfg.min_samples and checkpoint and live_auc < ref_auc - cfg.auc_drop:
            problem = f"gate AUC {live_auc:.3f} vs {ref_auc:.3f} at calibration"
        return DepthHealth(
            depth=d,
            samples=n,
            realised=realised,
            predicted=predicted,
            band=band,
            auc=live_auc,
            reference_auc=ref_auc,
            truncated=truncated,
            strikes=self._strikes[i],
            problem=problem,
        )

    def _prediction(self, d: int, conf: Tensor) -> tuple[float, float]:
        n, cfg = int(conf.numel()), self.config
        if self.policy.gate_maps is not None:
            depth = torch.full((n,), d, dtype=torch.int64)
            p = self.policy.gate_maps.expected_accept(depth, conf.clamp(min=0.0).log())
            se = float((p * (1 - p)).sum().sqrt()) / n
            return float(p.mean()), cfg.z * se + cfg.tolerance
        ref = self.policy.reference.get(d)
        if ref is None or ref.count == 0:
            return math.nan, math.inf
        rate = ref.accept_rate
        return rate, cfg.z * math.sqrt(rate * (1 - rate) / n) + cfg.tolerance


def gate_observations(
    pool: TreeBatch, accepted: Tensor, table: Tensor | None = None
) -> GateSamples:
    """Per request and drafted depth: ``(d, C_b(d), any depth-d node accepted)``.

    ``accepted``: [N] bool per pool node (on the accepted path). ``table``: the [B, D]
    confidences to report, D = ``pool.max_depth()`` (default ``depth_confidences(pool)``; a
    caller whose gates saw a larger pool than the one verified passes that pool's). Returns [M]
    tensors, M = number of (request, depth) cells that hold at least one node, ordered by
    request then depth.
    """
    if accepted.shape != (pool.num_nodes,) or accepted.dtype != torch.bool:
        raise GatingError(
            f"accepted must be [N={pool.num_nodes}] bool, got {tuple(accepted.shape)}"
        )
    if table is None:
        table = depth_confidences(pool)  # [B, D]
    elif table.shape != (pool.batch_size, pool.max_depth()):
        raise GatingError(
            f"table must be [B={pool.batch_size}, D={pool.max_depth()}], got {tuple(table.shape)}"
        )
    depths = table.shape[1]
    flat = pool.request_index() * depths + (pool.depth - 1)  # [N]
    cells = torch.zeros(table.numel(), dtype=torch.int64, device=pool.device)
    drafted = cells.index_add(0, flat, torch.ones_like(flat)) > 0
    hit = cells.scatter_reduce(0, flat, accepted.long(), reduce="amax", include_self=True) > 0
    depth = (torch.arange(table.numel(), device=pool.device) % max(depths, 1)) + 1
    return GateSamples(
        depth=depth[drafted], confidence=table.reshape(-1)[drafted], accepted=hit[drafted]
    )
