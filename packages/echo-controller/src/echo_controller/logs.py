"""structlog configuration, done once by the process entry point (CLI, server).

Libraries only call ``structlog.get_logger(__name__)``; this module decides the rendering:
key=value lines for people (default) or one JSON object per line (``--json-logs``).
Logs go to stderr so that stdout stays the program's output.
"""

from __future__ import annotations

import logging
import sys

import structlog

LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info", json_logs: bool = False) -> None:
    """Configure structlog and the stdlib root logger for the whole process."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    numeric = getattr(logging, level.upper())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json_logs
        else structlog.processors.KeyValueRenderer(key_order=["event", "level"], sort_keys=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(
        level=numeric, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s"
    )
