"""Fixtures shared by the adapter tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest
from kube_fakes import FAST_BACKOFF, fake_client
from kubelet_fakes import short_dir

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.kubelet import KubeletStandin


@pytest.fixture
async def server() -> AsyncIterator[FakeApiServer]:
    """An empty API server stand-in (a test module may override it to seed objects)."""
    async with FakeApiServer() as srv:
        yield srv


@pytest.fixture
async def http(server: FakeApiServer) -> AsyncIterator[httpx2.AsyncClient]:
    """Plain HTTP to the stand-in, past the agent's session."""
    async with httpx2.AsyncClient(base_url=server.url, trust_env=False) as client:
        yield client


@pytest.fixture
async def api(server: FakeApiServer, tmp_path: Path) -> AsyncIterator[KubeNodeApi]:
    """The agent's Kubernetes session on `server`, retrying fast."""
    client = fake_client(server.url, tmp_path)
    yield KubeNodeApi(client, backoff_s=FAST_BACKOFF)
    await client.close()


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    """A device-plugin directory short enough for unix socket paths."""
    yield from short_dir()


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    """The kubelet stand-in serving `plugin_dir`."""
    async with KubeletStandin(plugin_dir) as standin:
        yield standin
