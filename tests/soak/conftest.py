"""The soak tests drive the whole agent with the integration harness; its folder
joins the import path here, and logs are kept to errors as there."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from gpuslice import logs


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    saved = structlog.get_config()
    logs.setup("error")
    try:
        yield
    finally:
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()
