"""Log setup: every line is an event name plus key=value fields (or JSON)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TextIO

import structlog

LEVELS = ("debug", "info", "warning", "error")


def setup(
    level: str = "info",
    fmt: str = "text",
    stream: TextIO | None = None,
    bound: Mapping[str, str] | None = None,
) -> None:
    """Configure structlog once per process; `bound` fields (node=...) go on every line."""
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.processors.KeyValueRenderer(
            key_order=["timestamp", "level", "event"], drop_missing=True
        )
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    if bound:
        structlog.contextvars.bind_contextvars(**bound)
