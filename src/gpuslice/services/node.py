"""One node's whole agent: where its config comes from (the config manager), the agent
that converges the node's devices and front-ends to it, the node's labels and
accounting, run together on one loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from gpuslice.core.errors import GpusliceError
from gpuslice.core.ports import LabelSink
from gpuslice.core.readiness import Check, reported, verdict
from gpuslice.core.settings import Settings
from gpuslice.core.waiting import first_of
from gpuslice.services.agent import Agent
from gpuslice.services.config_manager import ConfigManager
from gpuslice.services.isolation import Isolation
from gpuslice.services.labeller import Labeller
from gpuslice.services.node_devices import NodeDevices
from gpuslice.services.sampler import Sampler
from gpuslice.services.watchdog import Watchdog

if TYPE_CHECKING:  # loaded only with --mig-parted-config
    from gpuslice.services.mig_manager import MigManager

log = structlog.get_logger("gpuslice.node")

Apply = Callable[[Settings], Awaitable[None]]


@dataclass
class LabelOptions:
    sinks: Sequence[LabelSink]
    interval_s: float | None = 60.0  # None: relabel only on changes
    timestamps: bool = True
    machine: str | None = None
    # Label once and stop: `gpuslice labels` only; beside the plugin labels follow the
    # config, so the Node keeps its labeller running.
    oneshot: bool = False


@dataclass(frozen=True)
class NodeParts:
    """A node's services, built (wiring.node): the agent, the config manager (the config
    file, or per-node configs) whose callback is `serve_config`, and what runs beside."""

    agent: Agent[NodeDevices]
    manager: ConfigManager[Settings]
    labeller: Labeller | None = None
    isolation: Isolation | None = None  # per-pod GPU memory limits (--memory-isolation)
    # The accounting sampler and the memory-budget watchdog it feeds.
    sampler: Sampler | None = None
    watchdog: Watchdog | None = None
    # Why the Kubernetes API's watches are down now (None: they hold, or no API).
    watch_trouble: Callable[[], str | None] = lambda: None
    # The MIG layout follower of nvidia.com/mig.config (--mig-parted-config).
    mig: MigManager | None = None


def serve_config(agent: Agent[NodeDevices], labeller: Labeller | None) -> Apply:
    """The config manager's callback: serve a config it chose; returns once served (raises
    if refused), so that what the manager reports is what the kubelet sees."""

    async def apply(settings: Settings) -> None:
        await agent.apply_settings(settings)
        if labeller is not None:
            labeller.nudge()  # labels follow in the background; they never decide a config

    return apply


class Node:
    def __init__(self, parts: NodeParts) -> None:
        self.parts = parts
        self.agent = parts.agent
        self.devices = parts.agent.node
        self.manager = parts.manager
        self.isolation = parts.isolation
        self.mig = parts.mig
        self.labeller = parts.labeller
        if self.isolation is not None and self.labeller is not None:
            self.isolation.notify = self.labeller.nudge
        if self.mig is not None and self.labeller is not None:
            self.mig.notify = self.labeller.nudge
        self.sampler = parts.sampler
        self.watchdog = parts.watchdog

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """What /readyz serves: the verdict of `checks()`."""
        return verdict(self.checks())

    def checks(self) -> list[Check]:
        """Ready once every front-end serves and is known to the kubelet, or waits to take
        over from a predecessor (its `waiting_for`), and no MPS resource waits for an old
        daemon's clients; details say why not (each front-end's status under its name),
        and which config is in force (a rejected one is reported here too)."""
        front_ends = self.agent.front_ends
        started = self.agent.ready.is_set() or any(f.waiting_for for f in front_ends)
        checks = [Check("started", started)]
        checks += [Check(f.name, f.ready(), dict(f.status())) for f in front_ends]
        if self.devices.unavailable is not None:
            checks.append(reported("backend", self.devices.unavailable))
        mps = self.devices.mps
        if mps is not None and mps.daemons:  # new replicas withheld for an old daemon's clients
            waiting = mps.waiting
            checks.append(Check("mps", not waiting, {"daemons": mps.status(), "waiting": waiting}))
        if not self.manager.one_config:
            checks.append(reported("config", self.manager.status.as_dict()))
        elif self.manager.rejected is not None:  # one config file, re-read on SIGHUP
            checks.append(reported("config", {"ok": False, "detail": self.manager.rejected}))
        watches = self.parts.watch_trouble()
        if watches is not None:  # reported, still ready: what they last said serves
            checks.append(reported("api", {"ok": False, "detail": f"{watches}; retrying"}))
        cdi_problem = self.devices.cdi_problem
        if cdi_problem is not None:  # reported, still ready
            checks.append(reported("cdi", {"ok": False, "detail": cdi_problem}))
        if self.labeller is not None:  # reported, never a reason to be unready
            checks.append(reported("labels", self.labeller.status()))
        if self.isolation is not None:  # reported, never a reason to be unready
            checks.append(reported("memoryIsolation", self.isolation.status()))
        if self.mig is not None:  # reported, never a reason to be unready
            checks.append(reported("migManager", self.mig.status()))
        return checks

    async def reload(self) -> bool:
        """Read the config again now (SIGHUP); False when it was refused."""
        return await self.manager.reload()

    async def run(self, stop: asyncio.Event, reload: asyncio.Event | None = None) -> None:
        """Serve until `stop`; each set of `reload` re-reads the config (SIGHUP)."""
        failed: GpusliceError | None = None
        try:
            async with asyncio.TaskGroup() as tasks:
                # Side by side: the agent serves the first config the manager chooses
                # and then each later one, even one chosen while the backend opens.
                tasks.create_task(self.manager.run(stop, reload))
                tasks.create_task(self.agent.run(stop))
                if self.labeller is not None:
                    tasks.create_task(self._label(stop))
                if self.sampler is not None:
                    tasks.create_task(self._sample(stop))
                if self.isolation is not None:
                    tasks.create_task(self._isolate(stop))
                if self.mig is not None:
                    tasks.create_task(self._mig_layouts(stop))
        except* GpusliceError as group:
            failed = group.exceptions[0]  # type: ignore[assignment]
        if failed is not None:  # raised out here: Python before 3.11.4 would wrap it in a group
            raise failed

    async def _label(self, stop: asyncio.Event) -> None:
        assert self.labeller is not None
        if await self._until_ready(stop):
            await self.labeller.run(stop)

    async def _sample(self, stop: asyncio.Event) -> None:
        """Accounting beside the agent once it serves; its failures never stop the agent."""
        assert self.sampler is not None
        if await self._until_ready(stop):
            log.info("sampling_started", interval_s=self.sampler.interval_s)
            await self.sampler.run(stop)

    async def _isolate(self, stop: asyncio.Event) -> None:
        """Per-pod memory limits once the agent serves (its resources give the shares)."""
        assert self.isolation is not None
        if await self._until_ready(stop):
            await self.isolation.run(stop)

    async def _mig_layouts(self, stop: asyncio.Event) -> None:
        """MIG layouts by node label once the agent serves (its live path re-serves)."""
        assert self.mig is not None
        if await self._until_ready(stop):
            await self.mig.run(stop)

    async def _until_ready(self, stop: asyncio.Event) -> bool:
        """Wait for the agent to be ready; False when stopped first."""
        await first_of(self.agent.ready.wait(), stop.wait())
        return not stop.is_set()
