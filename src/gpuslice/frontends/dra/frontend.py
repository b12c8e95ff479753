"""DraFrontEnd: the DRA kubelet plugin as one front-end of the node.

It serves the resources the node's settings build, except those kept on the
device-plugin API (per node each extended-resource name has one front-end). `prepare`
builds the DRA devices of a new snapshot and settings and asks the node state for what
they need (the MPS control daemons of its MPS resources, the same managed daemons the
device-plugin path uses); its step has the node provide them, looks up the NVIDIA
Container Toolkit's CDI devices, and hands the devices to the driver. `start` loads
the checkpoint; `run` serves both sockets, and then follows the node: every change of
the devices or of their health refreshes the health stream and publishes the slices
(a failed publish is retried with backoff), and a socket found deleted (a kubelet
directory wiped on restart) is served again within `check_s`.

Slices are published only while the kubelet has the plugin registered (its
NotifyRegistrationStatus): a pod scheduled on a device of an unregistered plugin fails
prepare and waits for the kubelet's one-minute resync. Each registration re-reads and
repairs them; a registration lost (refused, or the sockets served again after a wipe)
withdraws them. A watch on the node's slices notices a slice deleted or edited by
anyone else (a starting kubelet deletes them all) and has it repaired at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import structlog

from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.dra.devices import DraDevice, Json, build_devices, dra_settings
from gpuslice.core.dra.slices import published
from gpuslice.core.errors import BackendError, GpusliceError
from gpuslice.core.front_ends import dra_resources
from gpuslice.core.metrics import ResourceState
from gpuslice.core.ports import DraEndpoint, FrontEndStep, NodeView
from gpuslice.core.resources import Resource, build_resources
from gpuslice.core.restart import Backoff, jittered
from gpuslice.core.settings import Settings
from gpuslice.core.sharing import ResourceSettings
from gpuslice.core.waiting import first_of
from gpuslice.frontends.dra.driver import DraDriver
from gpuslice.frontends.dra.publisher import SlicePublisher

log = structlog.get_logger("gpuslice.dra")
PUBLISH_RETRY = Backoff(first_s=0.5, max_s=30.0)


NAME = "dra"


class DraFrontEnd:
    def __init__(
        self,
        node: NodeView,
        driver: DraDriver,
        publisher: SlicePublisher,
        endpoint: DraEndpoint,
        *,
        device_plugin: Collection[str] = (),
        check_s: float = 1.0,
        retry: Backoff = PUBLISH_RETRY,  # jittered: every node retries after an outage
        rand: random.Random | None = None,
        on_stop: Callable[[], Awaitable[None]] | None = None,  # release the API client
        # The NVIDIA Container Toolkit's CDI devices on the node (adapters.cdi_file's
        # lookup, shared with the device-plugin path); blocking, run off the loop.
        find_toolkit: Callable[[], ToolkitDevices] | None = None,
    ) -> None:
        self._find_toolkit = find_toolkit
        self._on_stop = on_stop
        self._view = node
        if find_toolkit is not None:  # the spec appearing or going while it runs
            node.on_toolkit(self._use_toolkit, always=True)
        self.driver = driver
        self.publisher = publisher
        self.endpoint = endpoint
        self._device_plugin = frozenset(device_plugin)
        self._check_s = check_s
        self._retry = retry
        self._rand = rand or random.Random()  # noqa: S311 - jitter, not secrecy
        self._poked = asyncio.Event()
        self.socket_restarts = 0
        self.waiting_for: str | None = None  # why the sockets are not served yet
        self.blocked = asyncio.Event()  # set once the sockets could not be served
        self.serving = asyncio.Event()  # set once the sockets are served
        self.published = asyncio.Event()  # set after each successful publish
        self.withheld = asyncio.Event()  # set once slices were held back: not registered
        self._was_registered = False
        self._withdrawn = False
        self.publish_error: str | None = None
        self.failed = asyncio.Event()
        self.error: GpusliceError | None = None

    def prepare(self, snapshot: HardwareSnapshot, settings: Settings) -> FrontEndStep:
        built = build_resources(snapshot, dra_settings(settings.resources, self.publisher.opts))
        resources = dra_resources(built, self._device_plugin)
        plan = self._view.plan_devices(NAME, snapshot, settings, resources)  # MPS: may raise
        devices = build_devices(snapshot, resources)
        kept = [r for r in built if r not in resources]  # the device-plugin API's

        async def step() -> None:
            await self._view.provide(plan)  # the MPS daemons of its MPS resources among them
            if self._find_toolkit is not None:
                await self._look_up_toolkit(self._find_toolkit)
            served: Sequence[DraDevice] = devices
            if self.driver.mig is not None:
                served = await self._partition(snapshot, kept, devices, settings.resources)
            await self.driver.set_devices(served)
            self._poked.set()

        return step

    async def _partition(
        self,
        snapshot: HardwareSnapshot,
        kept: list[Resource],
        devices: Sequence[DraDevice],
        settings: ResourceSettings,
    ) -> list[DraDevice]:
        """--dra-dynamic-mig: the GPUs DRA partitions are published as their partitions
        (their MIG devices as they are now are not: the sweep destroys those no claim
        owns). Raises BackendError."""
        mig = self.driver.mig
        assert mig is not None
        keys = [k for c in self.driver.prepared.values() for k in c.instances]
        mig.now = await mig.plan(snapshot, kept, keys, settings, self._device_plugin)
        if mig.now.gpus:
            log.info("dra_dynamic_mig_gpus", gpus=",".join(sorted(mig.now.gpus)),
                     devices=len(mig.now.by_name))  # fmt: skip
        return mig.now.served(devices)

    async def _look_up_toolkit(self, find: Callable[[], ToolkitDevices]) -> None:
        self._use_toolkit(await asyncio.to_thread(find))

    def _use_toolkit(self, found: ToolkitDevices) -> None:
        """Claims prepared from now on name `found`'s devices (none: its problem)."""
        if found.problem != self.driver.toolkit.problem or found.source != (
            self.driver.toolkit.source
        ):
            if found.problem is None:
                log.info("dra_toolkit_spec_found", path=found.source, devices=len(found.names))
            else:
                log.warning("dra_toolkit_spec_missing", detail=found.problem)
        self.driver.toolkit = found

    async def start(self) -> None:
        """Load the checkpoint: the claims prepared before (and their pods' memory
        limits) are known before any call and any isolation pass."""
        await self.driver.restore()

    async def run(self) -> None:
        await self._serve_sockets()
        try:
            await self.driver.settle()  # the sockets are ours: so is the checkpoint
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow())
                group.create_task(self._keep_sockets())
                group.create_task(self._watch_slices())
        finally:
            await self.endpoint.stop()

    @property
    def name(self) -> str:
        return NAME

    def ready(self) -> bool:
        return (
            self.endpoint.registered()
            and not self.publisher.pending
            and not self.driver.checkpoint_error
        )

    def resource_states(self) -> tuple[ResourceState, ...]:
        """None: DRA's devices are published as slices, not advertised per resource."""
        return ()

    def status(self) -> Mapping[str, object]:
        out: dict[str, Any] = {
            "driver": self.driver.driver,
            "registered": self.endpoint.registered(),
            "generation": self.publisher.generation,
            "sliceRepairs": self.publisher.repairs,
            "devices": len(self.driver.devices),
            "preparedClaims": len(self.driver.prepared),
        }
        if self.publish_error:
            out["publishError"] = self.publish_error
        if self.driver.checkpoint_error:
            out["checkpointError"] = self.driver.checkpoint_error
        if self.driver.recovery is not None:
            out["checkpointRebuilt"] = self.driver.recovery.status()
        if self.waiting_for:
            out["waitingFor"] = self.waiting_for
        if self.driver.mig is not None:  # which GPUs DRA partitions (the others: not)
            out["dynamicMigGpus"] = sorted(self.driver.mig.now.gpus)
        if self._find_toolkit is not None and self.driver.toolkit.problem:
            out["cdiToolkit"] = self.driver.toolkit.problem
        return out

    async def stop(self) -> None:
        try:
            await self.endpoint.stop()
        finally:
            if self._on_stop is not None:
                await self._on_stop()

    async def _serve_sockets(self) -> None:
        """Serve both sockets; while another process serves them (the agent this one
        replaces, during a rolling update) or they cannot be bound, try again every
        `check_s`, saying why once."""
        while True:
            try:
                await self.endpoint.start()
            except GpusliceError as exc:
                if str(exc) != self.waiting_for:
                    log.warning("dra_socket_not_served", error=str(exc))
                self.waiting_for = str(exc)
                self.blocked.set()
                await asyncio.sleep(self._check_s)
                continue
            self.waiting_for = None
            self.serving.set()
            return

    def release(self) -> None:
        """Nothing is held for a successor: its sockets are bound and renamed into place."""

    def _rebuilding(self) -> bool:
        """A bad checkpoint's claims wait for the API server to be read."""
        recovery = self.driver.recovery
        return recovery is not None and bool(recovery.unverified)

    async def _follow(self) -> None:
        attempt = rebuilds = 0
        registrations = -1
        while True:
            seen = self._view.generation
            changes = self.endpoint.registration_changes
            self._poked.clear()
            await self.driver.refresh_health()
            delay: float | None = None
            if self.driver.checkpoint_error:
                await self.driver.read_checkpoint_again()
                delay = self._check_s  # until it reads: nothing can be prepared
            elif self._rebuilding():  # settle() tried once: wait before each next try
                if rebuilds:
                    await self.driver.read_checkpoint_again()
                rebuilds += 1
                delay = self.retry_delay(rebuilds) if self._rebuilding() else None
            try:
                if changes != registrations:
                    self.publisher.stale = True  # every registration re-reads the slices
                registrations = changes
                await self._publish_or_withdraw(attempt)
                attempt, self.publish_error = 0, None
            except BackendError as exc:
                attempt += 1
                delay = self.retry_delay(attempt)
                self.publish_error = str(exc)
                log.warning("dra_publish_failed", error=str(exc), retry_s=delay)
            await self._wait(seen, changes, delay)

    async def _publish_or_withdraw(self, attempt: int) -> None:
        """Publish while registered; withdraw once a registration was lost, and while the
        checkpoint cannot be read (every prepare would be refused); before the first
        registration, leave the slices alone (an earlier agent's stay until then)."""
        unreadable = bool(self.driver.checkpoint_error)
        if self.endpoint.registered() and not unreadable:
            self._was_registered, self._withdrawn = True, False
            entries = published(
                self.driver.devices.values(), self._view.unhealthy, self.publisher.opts
            )
            counters: list[Json] = []
            if self.driver.mig is not None:
                entries, counters = self.driver.mig.now.publish(entries)
            if await self.publisher.publish(entries, counters) or attempt:
                self.published.set()
                self.published = asyncio.Event()
            return
        self.withheld.set()
        gone = self._was_registered or unreadable
        if gone and (not self._withdrawn or self.publisher.stale):
            await self.publisher.withdraw()
            self._withdrawn = True

    def retry_delay(self, attempt: int) -> float:
        """The wait before retry `attempt` of a publish or a slice watch: the backoff,
        jittered so the nodes of a cluster do not all retry in step."""
        return jittered(self._retry.delay(attempt), self._rand.uniform)

    async def _wait(self, seen: int, changes: int, delay: float | None) -> None:
        """Until the node changes, a step or the slice watch pokes, the registration
        changes, or `delay` passes."""
        await first_of(
            self._view.wait_changed(seen),
            self._poked.wait(),
            self.endpoint.wait_registration(changes),
            timeout_s=delay,
        )

    async def _watch_slices(self) -> None:
        """Follow the node's slices; a change that is not our own write pokes a repair.
        A watch that ends or fails is opened again (after a backoff when it failed), and
        the slices are re-read then, as events may have been missed meanwhile."""
        attempt = 0
        problem = ""
        while True:
            try:
                async for change in self.publisher.api.watch_slices(
                    self.publisher.node, self.publisher.opts.driver
                ):
                    if change.kind == "OPENED":
                        attempt = 0
                        if problem:
                            log.info("dra_slice_watch_resumed")
                            problem = ""
                    if self.publisher.noticed(change):
                        self._poked.set()
            except BackendError as exc:
                attempt += 1
                if str(exc) != problem:
                    log.warning("dra_slice_watch_failed", error=str(exc))
                problem = str(exc)
            self.publisher.stale = True
            self._poked.set()
            await asyncio.sleep(self.retry_delay(attempt) if attempt else self._check_s)

    async def _keep_sockets(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            if self.endpoint.sockets_present():
                continue
            log.warning("dra_socket_gone", driver=self.driver.driver)
            await self.endpoint.stop()
            try:
                await self.endpoint.start()
            except GpusliceError as exc:
                log.error("dra_socket_not_served", error=str(exc))
                continue
            self.socket_restarts += 1
