"""Calibration sharing, the controller's one optional feature: its settings and its loader.

With it, the controller pools the nodes' warm-up records per model pair and, when a node's drift
monitor advises it, recalibrates that pair's gates with echo-gating; the next leases of the pair
carry the new GatePolicy version (:mod:`.calibration_pool`). echo-gating needs torch, so this
module imports it only in :func:`calibration_pool`, when the feature is enabled: install it with
``pip install 'echo-controller[calibration]'`` (echo-server brings it anyway).

Without it (``--no-calibration``, ``ControllerConfig.calibration = None``) the controller splits
budgets as usual, ignores the records and drift advice in reports, and its leases carry no gate
policy version: every node keeps the gates it started with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from echo_controller.calibration_pool import CalibrationPool

ModelPair = tuple[str, str]  # (target, drafter)

INSTALL_HINT = (
    "install echo-gating to pool calibration records (pip install 'echo-controller[calibration]'),"
    " or run the controller without calibration sharing (--no-calibration)"
)


class CalibrationUnavailableError(ImportError):
    """Calibration sharing is enabled but echo-gating (or torch) cannot be imported."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    max_records: int = 200_000  # newest records kept per model pair
    min_records: int = 2_000  # a recalibration needs at least these
    min_interval_s: float = 30.0  # between two recalibrations of a pair

    def __post_init__(self) -> None:
        if self.max_records < 1 or not 1 <= self.min_records <= self.max_records:
            raise ValueError(
                f"need 1 <= min_records <= max_records, got {self.min_records}, {self.max_records}"
            )
        if self.min_interval_s < 0:
            raise ValueError(f"min_interval_s must be >= 0, got {self.min_interval_s}")


def calibration_pool(config: PoolConfig | None = None) -> CalibrationPool:
    """A new pool; raises :class:`CalibrationUnavailableError` without echo-gating."""
    try:
        from echo_controller.calibration_pool import CalibrationPool  # optional: needs torch
    except ImportError as exc:
        raise CalibrationUnavailableError(f"{INSTALL_HINT} ({exc})") from exc
    return CalibrationPool(config)
