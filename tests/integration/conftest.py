"""Shared fixtures: a short plugin directory, the kubelet stand-in on it, and an
agent launcher that stops every agent it started."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from agent_harness import AgentLauncher, remove_dir, short_dir
from faults_harness import FaultLauncher
from mps_harness import kill_daemons
from process_harness import AgentProcess

from gpuslice import logs
from gpuslice.testing.kubelet import KubeletStandin


@pytest.fixture(autouse=True)
def quiet_logs() -> Iterator[None]:
    """Only errors reach the test output (GPUSLICE_TEST_LOG=info for more); the
    logging config is restored after."""
    saved = structlog.get_config()
    logs.setup(os.environ.get("GPUSLICE_TEST_LOG", "error"))
    try:
        yield
    finally:
        structlog.configure(**saved)
        structlog.contextvars.clear_contextvars()


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    path = short_dir()
    try:
        yield path
    finally:
        remove_dir(path)


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    async with KubeletStandin(plugin_dir) as standin:
        yield standin


@pytest.fixture
async def launcher(plugin_dir: str) -> AsyncIterator[AgentLauncher]:
    agents = AgentLauncher(plugin_dir)
    try:
        yield agents
    finally:
        await agents.close()


@pytest.fixture
async def mps_root(plugin_dir: str, launcher: AgentLauncher) -> AsyncIterator[Path]:
    """An MPS root for the test's agents. MPS daemons outlive the agents that start them:
    the agents are stopped first (none starts one again), then every daemon left is killed."""
    path = Path(plugin_dir) / "mps"
    try:
        yield path
    finally:
        await launcher.close()
        kill_daemons(path)


@pytest.fixture
async def faults(plugin_dir: str) -> AsyncIterator[FaultLauncher]:
    """Like `launcher`, for agents whose dependencies a test changes first."""
    launcher = FaultLauncher(plugin_dir)
    try:
        yield launcher
    finally:
        await launcher.close()


@pytest.fixture
async def processes() -> AsyncIterator[list[AgentProcess]]:
    """`gpuslice run` processes a test started; each is killed at the end."""
    started: list[AgentProcess] = []
    try:
        yield started
    finally:
        for proc in started:
            await proc.kill()


Logged = list[MutableMapping[str, Any]]


@pytest.fixture
def logged() -> Iterator[Logged]:
    """Every log entry from info up (quiet_logs restores the log config after)."""
    with structlog.testing.capture_logs() as entries:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
        yield entries
