"""Fixtures of the tests that need a real GPU."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.core.errors import BackendError


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    """NVML on this machine's GPUs; the test is skipped where NVML does not load."""
    try:
        opened = NvmlBackend.open()
    except BackendError as exc:
        pytest.skip(f"NVML does not load here: {exc}")
    yield opened
    opened.close()
