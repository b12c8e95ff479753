"""MIG layouts by node label for device-plugin users: the label `nvidia.com/mig.config`
names a config of a mig-parted file (--mig-parted-config), and the agent makes each GPU's
layout the one it names, publishing `nvidia.com/mig.config.state` as mig-manager does.

It reconciles rather than reacts: every pass compares the wanted layout with the real one,
at start, on each change of the label or the file, and every `interval_s`, so a missed
event or a restart in the middle of an apply only delays the result. GPUs whose layout
does not change are never touched; a GPU whose devices a pod holds, or whose mode change
would reset it while processes run, waits (pending, with the reason) and changes once it
is free. The steps run on the backend's worker, then the agent re-reads the hardware
through its live path, so only the resources whose devices changed are re-advertised.
A bad config is refused in one line (failed) and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from functools import partial
from typing import Any

import structlog

from gpuslice.config.mig_parted import load_mig_parted_file
from gpuslice.core.devices import Gpu
from gpuslice.core.errors import BackendError, ConfigError, GpusliceError
from gpuslice.core.mig import IN_USE, RESET_REQUIRED, MigError
from gpuslice.core.mig_layout import Destroy, GpuPlan, MigGpu, SetMode, plan_layout
from gpuslice.core.mig_reconcile import (
    CONFIG_LABEL,
    FAILED,
    PENDING,
    SUCCESS,
    busy_gpus,
    decide,
    holders,
    state_labels,
)
from gpuslice.core.ports import DirWatch, GpuBackend, MigControl, PodResources
from gpuslice.core.waiting import first_of, unless_stopped
from gpuslice.services.config_selector import NodeLabelSource
from gpuslice.services.node_devices import NodeDevices

log = structlog.get_logger("gpuslice.mig")

INTERVAL_S = 30.0  # a pass at least this often: nothing waits on an event that was missed
RETRY_S = 5.0  # ... and this often while GPUs wait (for pods to go, for a GPU to be idle)
EVENT_REASONS = {
    PENDING: "MigConfigPending",
    SUCCESS: "MigConfigApplied",
    FAILED: "MigConfigFailed",
}
HOLD_BY = "migManager"  # NodeDevices.hold: the devices of GPUs being changed
Pods = Callable[[], AbstractAsyncContextManager[PodResources]]
Observed = tuple[list[MigGpu], frozenset[str]]


class MigManager:
    def __init__(
        self,
        path: str,
        node: str,
        source: NodeLabelSource,
        devices: NodeDevices,
        pods: Pods,
        refresh: Callable[[], Awaitable[None]],  # the agent re-reads and re-serves the GPUs
        *,
        watch: DirWatch | None = None,
        label: str = CONFIG_LABEL,
        interval_s: float = INTERVAL_S,
        retry_s: float = RETRY_S,
    ) -> None:
        self._path, self._node, self._source = path, node, source
        self._dir = os.path.dirname(os.path.abspath(path))
        self._devices, self._pods, self._refresh = devices, pods, refresh
        self._watch, self._label = watch, label
        self._interval, self._retry = interval_s, retry_s
        self.notify: Callable[[], None] = lambda: None  # the labeller's nudge
        self.value: str | None = None  # the label's value as last read
        self.state: str | None = None  # None while the label names no config
        self.reason = ""
        self._poked = asyncio.Event()
        self._passed = asyncio.Condition()

    def labels(self) -> dict[str, str]:
        return state_labels(self.state)

    def status(self) -> dict[str, Any]:
        """The readiness detail: reported, never a reason to be unready."""
        if self.state is None:
            return {"ok": True, "detail": f"label {self._label} unset"}
        detail = f"{self.value}: {self.state}" + (f"; {self.reason}" if self.reason else "")
        return {"ok": self.state == SUCCESS, "detail": detail}

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Until done() holds: checked now and after each pass."""
        async with self._passed:
            await self._passed.wait_for(done)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the label and the file, reconciling, until `stop`."""
        labels = self._source.watch_node_labels(self._node)
        first = await anext(labels, None)
        self.value = None if first is None else first.get(self._label) or None
        tasks = [asyncio.create_task(self._follow_labels(labels))]
        if self._watch is not None:
            tasks.append(asyncio.create_task(self._follow_file(self._watch)))
        try:
            while not stop.is_set():
                self._poked.clear()
                # A pass cut short by `stop` (the agent no longer serves the refresh) is
                # taken up again by the next start: it reconciles.
                done = await unless_stopped(self.reconcile(), stop)
                if done is None:
                    return
                if not done.result():
                    wait = self._retry if self.state == PENDING else self._interval
                    await first_of(stop.wait(), self._poked.wait(), timeout_s=wait)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await labels.aclose()  # type: ignore[attr-defined]

    async def reconcile(self) -> bool:
        """One pass; True when it changed GPUs (another pass then says how it stands)."""
        try:
            return await self._pass()
        finally:
            async with self._passed:
                self._passed.notify_all()

    async def _pass(self) -> bool:
        name = self.value
        if name is None:  # nothing asked for: nothing is touched, no state (as mig-manager)
            await self._set(None, "")
            return False
        try:
            config = await asyncio.to_thread(load_mig_parted_file, self._path)
            entries = config.entries(name)
            gpus, busy = await self._devices.on_backend(_observe)
            plans = plan_layout(entries, gpus)
            if any(p.steps for p in plans):  # who holds what matters only for a change
                plans = plan_layout(entries, await self._held(gpus))
        except ConfigError as exc:
            await self._set(FAILED, str(exc))
            return False
        except BackendError as exc:
            await self._set(PENDING, str(exc))
            return False
        verdict = decide(plans, busy)
        if not verdict.run:
            await self._set(verdict.state, verdict.reason)
            return False
        # The devices of the GPUs that change are withdrawn (Unhealthy) first, and who holds
        # what is read once more: no pod is given a device that is about to go.
        self._devices.hold(_devices_of(verdict.run, gpus), by=HOLD_BY)
        try:
            verdict = decide(plan_layout(entries, await self._held(gpus)), busy)
            await self._set(PENDING, verdict.reason or "applying")
            return await self._apply(name, verdict.run)
        except BackendError as exc:
            await self._set(PENDING, str(exc))
            return False
        finally:
            self._devices.hold(frozenset(), by=HOLD_BY)

    async def _apply(self, name: str, plans: tuple[GpuPlan, ...]) -> bool:
        """Each GPU's steps, then the agent serves what the GPUs now have."""
        if not plans:
            return False
        state, problem = PENDING, ""
        try:
            for plan in plans:
                log.info("mig_layout_applying", config=name, gpu=plan.index, steps=len(plan.steps))
                await self._devices.on_backend(partial(_execute, plan=plan))
        except MigError as exc:
            state, problem = (PENDING if exc.code in (IN_USE, RESET_REQUIRED) else FAILED), str(exc)
        except BackendError as exc:
            state, problem = FAILED, str(exc)
        # Served after a refusal too (steps before it ran); not once cut short by a stop,
        # when the agent no longer serves.
        await self._serve_new_devices()
        if problem:
            await self._set(state, problem)
        return not problem

    async def _held(self, gpus: list[MigGpu]) -> list[MigGpu]:
        """`gpus` with who holds their devices now (the kubelet's PodResources)."""
        used = await self._holders([g.gpu for g in gpus])
        return [replace(g, holders=used) for g in gpus]

    async def _holders(self, gpus: list[Gpu]) -> dict[str, tuple[str, ...]]:
        try:
            async with self._pods() as pods:
                listed = await pods.list()
        except Exception as exc:  # no change while who holds what is unknown
            raise BackendError(f"which pods hold the GPUs' devices cannot be read: {exc}") from exc
        return holders(listed, gpus)

    async def _serve_new_devices(self) -> None:
        try:
            await self._refresh()
        except GpusliceError as exc:  # the devices in force stay served
            log.error("mig_layout_not_served", error=str(exc))

    async def _set(self, state: str | None, reason: str) -> None:
        if (state, reason) == (self.state, self.reason):
            return
        self.state, self.reason = state, reason
        said = log.info if state in (SUCCESS, None) else log.warning
        said("mig_config_state", config=self.value, state=state, reason=reason)
        self.notify()
        if state is not None:
            message = f"MIG config {self.value}: {state}" + (f": {reason}" if reason else "")
            warning = state != SUCCESS
            await self._source.record_event(
                self._node, EVENT_REASONS[state], message, warning=warning
            )

    async def _follow_labels(self, labels: AsyncIterator[dict[str, str]]) -> None:
        async for current in labels:
            value = current.get(self._label) or None
            if value != self.value:
                log.info("mig_config_label_changed", old=self.value, new=value)
                self.value = value
                self._poked.set()

    async def _follow_file(self, watch: DirWatch) -> None:
        """Any change in the file's directory (a ConfigMap mount swaps `..data`)."""
        async with watch(self._dir, None) as events:
            async for _ in events:
                self._poked.set()


def _observe(backend: GpuBackend) -> Observed:
    """Each GPU with its MIG profiles and instances, and the GPUs with processes (on the
    backend's worker)."""
    mig = _control(backend)
    gpus = []
    for gpu in backend.snapshot().gpus:
        if gpu.mig_capable:
            gpus.append(MigGpu(gpu, mig.profiles(gpu.uuid), mig.instances(gpu.uuid)))
        else:
            gpus.append(MigGpu(gpu))
    return gpus, busy_gpus(backend.processes())


def _devices_of(plans: tuple[GpuPlan, ...], gpus: list[MigGpu]) -> frozenset[str]:
    """The GPU and MIG device UUIDs of the GPUs `plans` change."""
    changing = {p.uuid for p in plans}
    found = set(changing)
    for node in gpus:
        if node.gpu.uuid in changing:
            found.update(m.uuid for m in node.gpu.mig_devices)
    return frozenset(found)


def _execute(backend: GpuBackend, plan: GpuPlan) -> None:
    """One GPU's steps in order (on the backend's worker)."""
    mig = _control(backend)
    for step in plan.steps:
        if isinstance(step, Destroy):
            mig.destroy(plan.uuid, step.gi)
        elif isinstance(step, SetMode):
            mig.set_mig_mode(plan.uuid, step.enabled)
        else:
            mig.create(plan.uuid, step.profile, step.placement.start)


def _control(backend: GpuBackend) -> MigControl:
    mig = backend.mig_control()
    if mig is None:
        raise BackendError("the GPU backend cannot change MIG layouts")
    return mig
