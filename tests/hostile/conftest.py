"""The hostile-input suite runs agents as the integration tests do: the same harness
modules and fixtures (plugin_dir, kubelet, launcher, faults, processes, logged)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

_INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
sys.path.insert(0, str(_INTEGRATION))
_spec = importlib.util.spec_from_file_location("integration_fixtures", _INTEGRATION / "conftest.py")
assert _spec is not None
assert _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

quiet_logs = _fixtures.quiet_logs
plugin_dir = _fixtures.plugin_dir
kubelet = _fixtures.kubelet
launcher = _fixtures.launcher
faults = _fixtures.faults
processes = _fixtures.processes
logged = _fixtures.logged

from .invariant import AgentUnderAttack  # noqa: E402 - needs the harness path above


@pytest.fixture
async def agents() -> AsyncIterator[list[AgentUnderAttack]]:
    """`gpuslice run` processes a test attacks; each is killed at the end."""
    started: list[AgentUnderAttack] = []
    try:
        yield started
    finally:
        for agent in started:
            await agent.kill()
