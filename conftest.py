"""Test isolation for the whole repository.

A CLI test runs ``configure_logging`` (echo_controller.logs), which sets structlog's process-wide
configuration, its level filter included. ``structlog.testing.capture_logs`` replaces only the
processors, so a later test that captures an ``info`` event would see nothing after a CLI test
ran at ``--log-level warning``. Every test therefore starts from structlog's defaults.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _structlog_defaults() -> Iterator[None]:
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
