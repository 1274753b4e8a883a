"""echo-gating: ECHO's sparse confidence gating as a pure, typed, batched library.

Signals (layer confidence), warm-up records, per-depth AUC, checkpoint and threshold
calibration, calibrated acceptance maps, the GatePolicy artefact and drift monitoring.
"""

from echo_gating.calibrate import (
    CalibrationConfig,
    calibrate,
    calibrate_gates,
    calibration_report,
)
from echo_gating.checkpoints import DepthSeparation, select_checkpoints
from echo_gating.drift import DepthHealth, DriftConfig, DriftMonitor, DriftReport, gate_observations
from echo_gating.errors import CalibrationError, GatingError
from echo_gating.layerwise import (
    LABEL_RULES,
    LayerSeparation,
    layerwise_markdown,
    layerwise_separation,
)
from echo_gating.maps import AcceptanceMaps, DepthMap, fit_acceptance_maps, fit_depth_map
from echo_gating.policy import DepthStats, GateMode, GatePolicy
from echo_gating.records import RECORD_COLUMNS, GateSamples, RecordSet, RecordWriter, gate_samples
from echo_gating.report import CalibrationReport, DepthReport
from echo_gating.separation import auc, overlap
from echo_gating.signals import (
    depth_confidences,
    draft_entropy,
    layer_confidence,
    node_layer_confidence,
    top2_margin,
)
from echo_gating.thresholds import utility_threshold, youden_threshold

__all__ = [
    "LABEL_RULES",
    "RECORD_COLUMNS",
    "AcceptanceMaps",
    "CalibrationConfig",
    "CalibrationError",
    "CalibrationReport",
    "DepthHealth",
    "DepthMap",
    "DepthReport",
    "DepthSeparation",
    "DepthStats",
    "DriftConfig",
    "DriftMonitor",
    "DriftReport",
    "GateMode",
    "GatePolicy",
    "GateSamples",
    "GatingError",
    "LayerSeparation",
    "RecordSet",
    "RecordWriter",
    "auc",
    "calibrate",
    "calibrate_gates",
    "calibration_report",
    "depth_confidences",
    "draft_entropy",
    "fit_acceptance_maps",
    "fit_depth_map",
    "gate_observations",
    "gate_samples",
    "layer_confidence",
    "layerwise_markdown",
    "layerwise_separation",
    "node_layer_confidence",
    "overlap",
    "select_checkpoints",
    "top2_margin",
    "utility_threshold",
    "youden_threshold",
]
__version__ = "0.1.0"
