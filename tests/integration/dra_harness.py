"""The DRA front-end on simulated hardware, against the kubelet stand-in's DRA side and
the API server stand-in, over real unix sockets, real files and real HTTP.

DraRig starts DraFrontEnd with the real driver, publisher, gRPC server, checkpoint file,
CDI spec directory and Kubernetes client; only the GPUs (the fake backend's snapshot)
and the cluster (the stand-ins) are simulated. The node's health is NodeHealth: the
unhealthy set with a generation, as the node state hands it to front-ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig

from gpuslice.adapters.cdi_file import find_toolkit_devices
from gpuslice.adapters.dra.checkpoint import ClaimCheckpointFile
from gpuslice.adapters.dra.claim_specs import ClaimSpecDir
from gpuslice.adapters.dra.server import DraServer
from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.time_slices import FakeTimeSlices
from gpuslice.adapters.hosts.simulated import SIMULATED_MPS_CONTROL
from gpuslice.adapters.kube.dra_api import KubeDraApi
from gpuslice.adapters.mps import ControlCommands, LocalLauncher
from gpuslice.config.options import resolve_options
from gpuslice.config.settings import load_config
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.devices import DraOptions
from gpuslice.core.settings import Settings
from gpuslice.frontends.dra.claim_mps import HOLDER, ClaimDaemons
from gpuslice.frontends.dra.driver import DraDriver
from gpuslice.frontends.dra.dynamic_mig import MigInstances
from gpuslice.frontends.dra.frontend import DraFrontEnd
from gpuslice.frontends.dra.publisher import SlicePublisher
from gpuslice.services.cdi import CdiSpecs
from gpuslice.services.claim_shares import ClaimShares
from gpuslice.services.mps import DaemonSettings, MpsDaemons, MpsTools
from gpuslice.services.node_devices import HEALTH, NodeDevices
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.kubelet.dra import DraKubeletStandin
from gpuslice.wiring.host import host, plugin_settings

NODE = "node-a"
DRIVER = "gpu.nvidia.com"
WAIT_S = 5.0


class NodeHealth:
    """The node's device state (services.node_devices, as `gpuslice run` has it) on the
    simulated hardware, committed with `settings`; `mark` is health's own report."""

    def __init__(self, devices: NodeDevices, session: contextlib.AsyncExitStack) -> None:
        self.devices = devices
        self._session = session

    @classmethod
    async def open(
        cls, hardware: str, settings: Settings, cdi: CdiSpecs | None = None
    ) -> NodeHealth:
        devices = NodeDevices(lambda: FakeBackend.from_spec(hardware), cdi=cdi)
        session = contextlib.AsyncExitStack()
        node = await session.enter_async_context(devices.session())
        node.commit(await node.read(), settings)
        return cls(devices, session)

    async def close(self) -> None:
        await self._session.aclose()

    @property
    def settings(self) -> Settings:
        return self.devices.settings

    async def mark(self, *uuids: str) -> None:
        """What the health monitor reports: these GPUs or MIG devices unhealthy now."""
        self.devices.hold(frozenset(uuids), by=HEALTH)


def node_settings(tmp: Path, config: str | None = None, **flags: str) -> Settings:
    values = dict(flags)
    if config is not None:
        path = tmp / "config.yaml"
        path.write_text(config, encoding="utf-8")
        values["config-file"] = str(path)
    opts = resolve_options(values)
    return plugin_settings(load_config(opts), opts, host(opts))


@dataclass
class DraRig:
    """One running front-end and what tests drive and observe it with."""

    api: FakeApiServer
    kubelet: DraKubeletStandin
    root: str  # registry/, plugins/<driver>/, cdi/ below it
    snapshot: HardwareSnapshot
    health: NodeHealth
    opts: DraOptions
    frontend: DraFrontEnd = field(init=False)
    task: asyncio.Task[None] | None = None
    client: AsyncClient | None = None
    slicer: FakeTimeSlices = field(default_factory=FakeTimeSlices)  # the GPUs' time slice
    shares: ClaimShares | None = None  # the pods' memory limits, for an Isolation (start())
    specs: Callable[[str], ClaimSpecDir] = ClaimSpecDir  # the CDI spec directory's adapter
    # the claims' own MPS daemons (in <root>/mps): the simulated control daemon, as real
    # processes
    mps: ClaimDaemons | None = None
    mps_wait_s: float = WAIT_S

    @property
    def registry(self) -> str:
        return os.path.join(self.root, "registry")

    @property
    def plugin_dir(self) -> str:
        return os.path.join(self.root, "plugins", DRIVER)

    @property
    def cdi_dir(self) -> str:
        return os.path.join(self.root, "cdi")

    def gpu(self, index: int) -> str:
        return self.snapshot.gpus[index].uuid

    async def start(self, **kw: Any) -> None:
        """Start a front-end (a new one after stop(): an agent restart)."""
        config = KubeConfig.from_file(write_kubeconfig(Path(self.root), self.api.url))
        self.client = AsyncClient(config=config, trust_env=False)
        api = KubeDraApi(self.client)
        tools = MpsTools(
            LocalLauncher(SIMULATED_MPS_CONTROL), ControlCommands(SIMULATED_MPS_CONTROL)
        )
        daemons = MpsDaemons(tools, DaemonSettings(claims=True, holder=HOLDER, poll_s=0.05))
        hold, mps_root = self.health.devices.hold, os.path.join(self.root, "mps")
        self.mps = ClaimDaemons(daemons, hold, mps_root, wait_s=self.mps_wait_s)
        driver = DraDriver(
            node=NODE,
            opts=self.opts,
            view=self.health.devices,
            api=api,
            checkpoint=ClaimCheckpointFile(self.plugin_dir),
            specs=self.specs(self.cdi_dir),
            time_slicer=self.slicer,
            shares=self.shares,
            mig=MigInstances(self.health.devices.on_backend) if self.opts.dynamic_mig else None,
            mps=self.mps,
        )
        endpoint = DraServer(driver, registry_dir=self.registry, plugin_dir=self.plugin_dir)
        publisher = SlicePublisher(api, node=NODE, opts=self.opts)
        kw.setdefault("find_toolkit", lambda: find_toolkit_devices(self.cdi_dir))
        self.frontend = DraFrontEnd(
            self.health.devices, driver, publisher, endpoint, check_s=0.05, **kw
        )
        await self.frontend.start()
        await self.frontend.prepare(self.snapshot, self.health.settings)()
        self.task = asyncio.create_task(self.frontend.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
        if self.mps is not None:  # its daemons run on, as an agent's do
            await self.mps.close()
            self.mps = None
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def published(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """Wait until the node's newest slices hold devices satisfying `predicate`."""
        await self.api.wait_for(lambda s: predicate(s.dra.node_devices(NODE)))
        return self.api.dra.node_devices(NODE)

    def put_claim(self, name: str, *devices: str, config: Iterable[dict[str, Any]] = (),
                  **result: Any) -> tuple[str, str, str]:  # fmt: skip
        """An allocated claim in namespace ml; its (namespace, uid, name)."""
        results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d, **result}
                   for d in devices]  # fmt: skip
        claim = self.api.dra.put_claim("ml", name, results, list(config))
        return ("ml", claim["metadata"]["uid"], name)

    def checkpoint(self) -> dict[str, Any]:
        return dict(json.loads(Path(self.plugin_dir, "checkpoint.json").read_text()))

    def spec_files(self) -> list[str]:
        return sorted(os.listdir(self.cdi_dir)) if os.path.isdir(self.cdi_dir) else []


@contextlib.asynccontextmanager
async def dra_rig(
    root: str,
    tmp: Path,
    *,
    hardware: str = "dgx-a100",
    config: str | None = None,
    opts: DraOptions | None = None,
    flags: dict[str, str] | None = None,
    cdi: CdiSpecs | None = None,  # the node's CDI specs (its toolkit lookup followed)
    register: bool = True,  # the kubelet registers the plugin at once, as on a node
    **kw: Any,
) -> AsyncIterator[DraRig]:
    health = await NodeHealth.open(hardware, node_settings(tmp, config, **(flags or {})), cdi)
    snapshot = health.devices.snapshot
    async with FakeApiServer() as api:
        kubelet = DraKubeletStandin(
            os.path.join(root, "registry"), os.path.join(root, "cdi"), slices=api.dra, node=NODE
        )
        rig = DraRig(api, kubelet, root, snapshot, health, opts or DraOptions())
        await rig.start(**kw)
        if register:
            await kubelet.discover(DRIVER)
        try:
            yield rig
        finally:
            await kubelet.close()
            await rig.stop()
            await health.close()


def uids(*claims: tuple[str, str, str]) -> list[str]:
    return [uid for _, uid, _ in claims]
