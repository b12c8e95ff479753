"""Fixtures of the hostile-input suite: a plugin directory, the kubelet stand-in on it
(serving PodResources too), and the agents a test attacks, killed at the end."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest

from gpuslice.testing.kubelet import KubeletStandin

from .invariant import AgentUnderAttack, short_dir


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    path = short_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    os.makedirs(os.path.join(plugin_dir, "pr"), exist_ok=True)
    async with KubeletStandin(plugin_dir, os.path.join(plugin_dir, "pr", "kubelet.sock")) as k:
        yield k


@pytest.fixture
async def agents() -> AsyncIterator[list[AgentUnderAttack]]:
    started: list[AgentUnderAttack] = []
    try:
        yield started
    finally:
        for agent in started:
            await agent.kill()
