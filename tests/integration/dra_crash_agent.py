"""The DRA front-end as a process of its own, to be killed mid-call by a test.

    python dra_crash_agent.py ROOT KUBECONFIG [STEP]

It serves DRA (driver, gRPC sockets, checkpoint file, CDI spec directory, the API
through the kubeconfig) on simulated dgx-a100 under ROOT, as dra_harness.DraRig lays it
out. With STEP ("3" or "3+"), it stops before (or after) the STEP-th file operation of
the calls it serves (a checkpoint save, a spec write or removal; those of its own start
are not counted), writes ROOT/paused, and waits there to be killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig

from gpuslice.adapters.dra.checkpoint import ClaimCheckpointFile
from gpuslice.adapters.dra.claim_specs import ClaimSpecDir
from gpuslice.adapters.dra.server import DraServer
from gpuslice.adapters.kube.dra_api import KubeDraApi
from gpuslice.core.dra.claims import PreparedClaim
from gpuslice.core.dra.devices import DraOptions
from gpuslice.frontends.dra.driver import DraDriver
from gpuslice.frontends.dra.frontend import DraFrontEnd
from gpuslice.frontends.dra.publisher import SlicePublisher

sys.path.insert(0, os.path.dirname(__file__))
from dra_harness import DRIVER, NODE, NodeHealth, node_settings


class Steps:
    """Counts the file operations once `counting`; pauses at the one asked for."""

    def __init__(self, root: str, step: str) -> None:
        self.root = root
        self.at = int(step.rstrip("+")) if step else 0
        self.after = step.endswith("+")
        self.done = 0
        self.counting = False

    async def run(self, op: Callable[[], Awaitable[None]]) -> None:
        if self.counting:
            self.done += 1
            if self.done == self.at and not self.after:
                await self._pause()
        await op()
        if self.counting and self.done == self.at and self.after:
            await self._pause()

    async def _pause(self) -> None:
        await asyncio.to_thread(Path(self.root, "paused").write_text, str(self.done))
        await asyncio.Event().wait()  # until killed


class Checkpoint(ClaimCheckpointFile):
    def __init__(self, directory: str, steps: Steps) -> None:
        super().__init__(directory)
        self.steps = steps

    async def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True) -> None:
        await self.steps.run(lambda: super(Checkpoint, self).save(claims, durable=durable))


class Specs(ClaimSpecDir):
    def __init__(self, directory: str, steps: Steps) -> None:
        super().__init__(directory)
        self.steps = steps

    async def write(self, name: str, text: str) -> None:
        await self.steps.run(lambda: super(Specs, self).write(name, text))

    async def remove(self, name: str) -> None:
        await self.steps.run(lambda: super(Specs, self).remove(name))


async def main(root: str, kubeconfig: str, step: str) -> None:
    steps = Steps(root, step)
    health = await NodeHealth.open("dgx-a100", node_settings(Path(root)))
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), trust_env=False)
    api = KubeDraApi(client)
    opts = DraOptions()
    plugin_dir = os.path.join(root, "plugins", DRIVER)
    driver = DraDriver(
        node=NODE,
        opts=opts,
        view=health.devices,
        api=api,
        checkpoint=Checkpoint(plugin_dir, steps),
        specs=Specs(os.path.join(root, "cdi"), steps),
    )
    endpoint = DraServer(driver, registry_dir=os.path.join(root, "registry"),
                         plugin_dir=plugin_dir)  # fmt: skip
    front: Any = DraFrontEnd(
        health.devices, driver, SlicePublisher(api, node=NODE, opts=opts), endpoint
    )
    await front.start()
    await front.prepare(health.devices.snapshot, health.settings)()
    steps.counting = True
    await front.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""))
