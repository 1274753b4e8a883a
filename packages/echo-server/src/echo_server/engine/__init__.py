"""The serving engine: requests, admission, the step loop, verification, acceptance, reports."""

from echo_server.engine.config import EngineConfig
from echo_server.engine.engine import Engine
from echo_server.engine.report import StepReport, VerifiedStep
from echo_server.engine.request import FinishReason, GenerationRequest, RequestError, StepEvent

__all__ = [
    "Engine",
    "EngineConfig",
    "FinishReason",
    "GenerationRequest",
    "RequestError",
    "StepEvent",
    "StepReport",
    "VerifiedStep",
]
