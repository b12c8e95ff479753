"""The node's devices: what the node knows reads the same before any commit (no GPUs
served), and what runs on it belongs to a session that exists only while the backend is
open; health runs from the first commit on, inside `serving`, which the session ends."""

from __future__ import annotations

import asyncio

from health_fakes import ScriptedBackend

from gpuslice.adapters.fake import load_spec
from gpuslice.core.devices import HealthEvent
from gpuslice.core.response import AllocateOptions
from gpuslice.core.settings import Settings
from gpuslice.core.sharing import ResourceSettings
from gpuslice.services.node_devices import HEALTH, NodeDevices

SETTINGS = Settings(ResourceSettings(), AllocateOptions(), source="test")


def test_before_any_commit_the_node_serves_no_gpus() -> None:
    devices = NodeDevices(lambda: ScriptedBackend(load_spec("t4")))
    assert devices.snapshot.gpus == ()
    assert devices.settings.resources == ResourceSettings()
    assert (devices.generation, devices.unhealthy, devices.resources) == (0, frozenset(), ())


def test_the_agent_drives_no_sub_lifecycle_of_the_node() -> None:
    public = {name for name in dir(NodeDevices) if not name.startswith("_")}
    assert not public & {"watch_health", "follow_holds", "health_changed", "read", "commit"}


async def test_health_runs_from_the_first_commit_while_serving() -> None:
    snapshot = load_spec("t4")
    backend = ScriptedBackend(snapshot)
    devices = NodeDevices(lambda: backend)
    gpu = snapshot.gpus[0].uuid
    async with devices.session() as session:
        first = session.commit(await session.read(), SETTINGS)
        assert (first.snapshot, devices.snapshot) == (snapshot, snapshot)
        assert devices.settings == SETTINGS
        assert backend.waits == 0  # no health watch before serving
        async with session.serving(first) as background:
            assert background == ()  # no PodResources: no holds to check
            seen = devices.generation
            backend.push(HealthEvent(gpu, "lost"))
            async with asyncio.timeout(5):
                while gpu not in devices.unhealthy:
                    seen = await devices.wait_changed(seen)
            assert devices.held[HEALTH] == {gpu}
            assert devices.health_marks == {gpu}
        assert not backend.closed.is_set()
    assert backend.closed.is_set()
