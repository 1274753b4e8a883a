"""The serving engine: requests, the step loop, verification, metrics."""

from echo_server.engine.engine import Engine, EngineConfig
from echo_server.engine.request import FinishReason, GenerationRequest, RequestError, StepEvent

__all__ = [
    "Engine",
    "EngineConfig",
    "FinishReason",
    "GenerationRequest",
    "RequestError",
    "StepEvent",
]
