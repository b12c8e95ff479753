"""Fixtures shared by the adapter tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuslice.testing.apiserver import FakeApiServer


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    """An empty API server stand-in (a test module may override it to seed objects)."""
    async with FakeApiServer() as srv:
        yield srv
