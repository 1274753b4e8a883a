"""Errors of the budget control plane, each mapped to one gRPC status code by the servicers.

All derive from :class:`ControlPlaneError`, a ``ValueError`` like echo-core's ``EchoError`` but
not one: echo-core needs torch, and the controller must not. Serving nodes raise and catch
:class:`FieldError` for their own messages too (the node-only errors stay in
``echo_server.node.errors``).
"""

from __future__ import annotations


class ControlPlaneError(ValueError):
    """Base class of the controller's input and protocol errors."""


class FieldError(ControlPlaneError):
    """A request field is malformed (INVALID_ARGUMENT); ``field`` is its path in the message."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownNodeError(ControlPlaneError):
    """The controller does not know the node id (NOT_FOUND): the node registers again."""


class StaleRegistrationError(ControlPlaneError):
    """A call carries a replaced registration of its node id (FAILED_PRECONDITION)."""


class CalibrationFailedError(ControlPlaneError):
    """Recalibrating a model pair's gates from its pooled records failed (the pool backs off)."""
