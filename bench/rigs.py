"""The agent as `gpuslice run` wires it, in this process, against the kubelet stand-in.

Also the scratch directories (short /tmp paths: unix sockets allow 108 bytes) and the
config and node files the benchmarks write.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuslice import logs
from gpuslice.config.options import resolve_options
from gpuslice.frontends.deviceplugin import ResourceHandler
from gpuslice.services.agent import Agent
from gpuslice.services.node import Node
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.agent import Parts, device_plugin_of, parts
from gpuslice.wiring.node import build_node

GPU = "nvidia.com/gpu"
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
READY_TIMEOUT_S = 30.0


def quiet_logs() -> None:
    """Log at the agent's default level, as `gpuslice run` does, into /dev/null."""
    logs.setup("info", stream=open(os.devnull, "w"))  # noqa: SIM115 (lives as long as the run)


@contextlib.contextmanager
def scratch(prefix: str = "gsb-") -> Iterator[str]:
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def time_slicing(path: str, replicas: int, mig_strategy: str = "none") -> str:
    """Write a v1 config sharing every GPU (or MIG device) as `replicas` replicas."""
    Path(path).write_text(
        "version: v1\n"
        f"flags:\n  migStrategy: {mig_strategy}\n"
        "sharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: {GPU}\n      replicas: {replicas}\n",
        encoding="utf-8",
    )
    return path


def mig_node(path: str, gpus: int = 8, profile: str = "1g.5gb", first_gi: int = 7) -> str:
    """Write a node file: `gpus` A100-40GB, each split into seven MIG devices."""
    migs = "".join(f"      - {{profile: {profile}, gi: {first_gi + i}}}\n" for i in range(7))
    Path(path).write_text(
        "name: bench-mig-node\n"
        'driver_version: "550.54.15"\n'
        "cuda_driver_version: 12040\n"
        "gpus:\n"
        f"  - model: a100-40gb\n    count: {gpus}\n    numa_node: 0\n"
        f"    mig_enabled: true\n    mig_devices:\n{migs}",
        encoding="utf-8",
    )
    return path


serving = KubeletStandin.serves  # (kubelet, {resource: device count}) -> bool


@dataclass
class Rig:
    node: Node
    kubelet: KubeletStandin
    plugin_dir: str
    events_path: str

    @property
    def agent(self) -> Agent:
        return self.node.agent

    @property
    def handlers(self) -> dict[str, ResourceHandler]:
        return device_plugin_of(self.node).manager.handlers

    @property
    def expected(self) -> dict[str, int]:
        """resource -> device count, as the agent serves them now."""
        return {name: len(h.devices()) for name, h in self.handlers.items()}

    def socket(self, resource: str) -> str:
        return os.path.join(self.plugin_dir, self.handlers[resource].resource.socket_name)

    async def settled(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until the stand-in streams everything the agent serves, all healthy."""
        want = self.expected
        await self.kubelet.wait_for(lambda k: serving(k, want), timeout_s)


@contextlib.asynccontextmanager
async def agent_rig(
    plugin_dir: str,
    hardware: str,
    config: str | None = None,
    config_name: str | None = None,
    adapt: Callable[[Parts], Parts] | None = None,
    flags: dict[str, str] | None = None,
) -> AsyncIterator[Rig]:
    """A stand-in on `plugin_dir` and the agent serving it, settled; stopped on exit."""
    events = os.path.join(plugin_dir, "events.jsonl")
    values = {"kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"), **(flags or {})}
    if config:
        values["config-file"] = config
    opts = resolve_options(
        values, config_name=config_name, fake_hardware=hardware, fake_events=events
    )
    chosen = parts(opts)
    node = build_node(opts, None, with_parts=adapt(chosen) if adapt else chosen)
    stop = asyncio.Event()
    async with KubeletStandin(plugin_dir) as kubelet:
        task = asyncio.create_task(node.run(stop))
        try:
            await until_ready(node.agent, task)
            rig = Rig(node, kubelet, plugin_dir, events)
            await rig.settled()
            yield rig
        finally:
            stop.set()
            await task


async def until_ready(agent: Agent, task: asyncio.Task[None]) -> None:
    """Wait for `agent` to serve, failing fast with its error if `task` ends first."""
    waiter = asyncio.create_task(agent.ready.wait())
    done, _ = await asyncio.wait(
        {waiter, task}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
    )
    if waiter not in done:
        waiter.cancel()
        if task in done:
            task.result()  # the agent's own error
        raise RuntimeError("the agent did not become ready")
