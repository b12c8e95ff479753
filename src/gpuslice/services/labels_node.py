"""`gpuslice labels`: the node's labels without a front-end, run as GPU Feature Discovery
runs: label and publish, then (unless oneshot) relabel every sleep interval until
stopped; each reload (SIGHUP) re-reads the config file and relabels at once.

The backend and its worker thread are the node's device state (services.node_devices);
the config file is followed by the config manager, as beside the device plugin. The
hardware is read afresh for each labelling. A config refused on reload keeps the last
good one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.resources import build_resources
from gpuslice.core.serving import plan_serving
from gpuslice.core.settings import Settings
from gpuslice.core.sharing import ResourceSettings
from gpuslice.core.waiting import first_of
from gpuslice.services.config_manager import ConfigManager
from gpuslice.services.labeller import Labeller, LabelPolicy, snapshot_labels
from gpuslice.services.node import Apply, LabelOptions
from gpuslice.services.node_devices import NodeDevices
from gpuslice.services.node_session import NodeSession

log = structlog.get_logger("gpuslice.labels")

NO_GPUS = HardwareSnapshot(gpus=())


class LabelsNode:
    def __init__(
        self,
        devices: NodeDevices,
        config: Callable[[Apply], ConfigManager[Settings]],
        labels: LabelOptions,
        first: Settings,
        *,
        pinned_limit_mib: int = 0,  # --mps-pinned-memory-limit, as `run` checks it
    ) -> None:
        self.devices = devices
        self.manager = config(self._apply)
        self._first = first
        self._settings = first
        self._pinned = pinned_limit_mib
        self._session: NodeSession | None = None  # while the backend is open
        self.labeller = Labeller(
            snapshot_labels(self._read, machine=labels.machine),
            labels.sinks,
            LabelPolicy(
                interval_s=labels.interval_s, oneshot=labels.oneshot, timestamps=labels.timestamps
            ),
        )

    async def run(self, stop: asyncio.Event, reload: asyncio.Event | None = None) -> None:
        """Label until `stop` (once when oneshot). Raises GpusliceError for a backend that
        cannot start (unless failOnInitError is false) and, in oneshot mode, a labelling
        or output that fails."""
        async with contextlib.AsyncExitStack() as stack:
            try:
                self._session = await stack.enter_async_context(self.devices.session())
            except GpusliceError as exc:
                if self._first.fail_on_init_error:
                    raise
                log.error("backend_unavailable_labelling_no_gpus", error=str(exc))
            done = asyncio.Event()
            async with self._following(done):
                await self.manager.ready.wait()
                async with self._on_each(reload):
                    await self.labeller.run(stop)
                done.set()

    async def _apply(self, settings: Settings) -> None:
        self._settings = settings

    async def _read(self) -> tuple[HardwareSnapshot, ResourceSettings]:
        settings = self._settings
        if self._session is None:
            return NO_GPUS, settings.resources
        snapshot = await self._session.read()
        # what `run` refuses on this hardware is not labelled either (the agent's planning)
        resources = build_resources(snapshot, settings.resources)
        mps_root = settings.allocate.mps_root
        plan_serving(snapshot, resources, settings.memory, mps_root, pinned_limit_mib=self._pinned)
        return snapshot, settings.resources

    async def _reread(self) -> None:
        await self.manager.reload()  # a refused config is logged; the last good one stays
        try:
            await self.labeller.relabel()
        except GpusliceError as exc:
            log.error("labels_failed", error=str(exc))

    @contextlib.asynccontextmanager
    async def _following(self, done: asyncio.Event) -> AsyncIterator[None]:
        """The config manager (the config file's first read) while the block runs."""
        task = asyncio.create_task(self.manager.run(done))
        await first_of(task, self.manager.ready.wait())
        if task.done():
            task.result()  # raises the first read's error
        try:
            yield
        finally:
            done.set()
            await task

    @contextlib.asynccontextmanager
    async def _on_each(self, event: asyncio.Event | None) -> AsyncIterator[None]:
        """Re-read and relabel each time `event` is set, while the block runs."""

        async def follow() -> None:
            assert event is not None
            while True:
                await event.wait()
                event.clear()
                await self._reread()

        task = None if event is None else asyncio.create_task(follow())
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
