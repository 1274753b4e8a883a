"""Errors of the scheduler package (all :class:`echo_core.errors.EchoError`, so ``ValueError``)."""

from __future__ import annotations

from echo_core.errors import EchoError


class SchedulerError(EchoError):
    """Base class of echo-scheduler's input errors."""


class PolicyError(SchedulerError):
    """A policy was driven out of order or given inconsistent inputs."""


class CostModelError(SchedulerError):
    """Bad measurements or arguments for the verify-cost model or budget choice."""


class TraceError(SchedulerError):
    """A trace or simulated drafter request does not fit the pool it refers to."""
