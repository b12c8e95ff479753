"""Health events -> per-device marks -> the advertised lists, with recovery.

Owns the HealthThread (events arrive on the loop) and the re-probe timer. Each
change of the unhealthy set goes to `on_change` (the node state's hold(by="health")),
which returns the resources whose lists changed; each mark and recovery is
logged with the XID, the GPU, the fault class and the resources holding it.
Blocking backend calls (probe) run through `call`, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType, TracebackType
from typing import Protocol, TypeVar

import structlog

from gpuslice.core.devices import Gpu, HardwareSnapshot, HealthEvent
from gpuslice.core.health import XidPolicy
from gpuslice.core.health_scope import every_gpu, fault_scope, find_gpu, recovery_scope
from gpuslice.core.health_state import (
    LOST,
    WAIT_FAILED,
    XID,
    Change,
    HealthBook,
    Reason,
    RecoveryPolicy,
)
from gpuslice.core.metrics import NO_METRICS, XID_IGNORED, GpuRef
from gpuslice.core.ports import GpuBackend, Metrics
from gpuslice.core.resources import Resource
from gpuslice.services.health_thread import HealthThread

log = structlog.get_logger("gpuslice.health")

T = TypeVar("T")


class BlockingCall(Protocol):
    """Runs a blocking function off the loop (the agent's worker thread)."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


async def _to_thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


class HealthMonitor:
    def __init__(
        self,
        backend: GpuBackend,
        policy: XidPolicy,
        on_change: Callable[[frozenset[str]], list[str]],
        *,
        recovery: RecoveryPolicy | None = None,
        call: BlockingCall = _to_thread,
        clock: Callable[[], float] = time.monotonic,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self.policy = policy
        self._metrics = metrics
        self._backend = backend
        self._on_change = on_change
        self._book = HealthBook(recovery)
        self._call = call
        self._clock = clock
        self._snapshot = HardwareSnapshot(gpus=())
        self._advertised: frozenset[str] = frozenset()
        self._holders: dict[str, tuple[str, ...]] = {}
        self._published: frozenset[str] = frozenset()
        self._wake = asyncio.Event()
        self._probing = asyncio.Lock()
        self._thread: HealthThread | None = None
        self._timer: asyncio.Task[None] | None = None

    @property
    def recovery(self) -> RecoveryPolicy:
        return self._book.policy

    @property
    def unhealthy(self) -> frozenset[str]:
        """GPU and MIG UUIDs marked unhealthy now."""
        return self._book.unhealthy

    @property
    def reasons(self) -> Mapping[str, Reason]:
        """Device -> why it is unhealthy (a read-only copy)."""
        return MappingProxyType(self._book.reasons)

    def set_hardware(self, snapshot: HardwareSnapshot, resources: Iterable[Resource] = ()) -> None:
        """What the node holds and serves now; call after every (re)apply."""
        holders: dict[str, set[str]] = {}
        for res in resources:
            for dev in res.devices:
                holders.setdefault(dev.gpu_uuid, set()).add(res.name)
                holders.setdefault(dev.physical_id, set()).add(res.name)
        self._snapshot = snapshot
        self._advertised = frozenset(d for d in holders if d)
        self._holders = {d: tuple(sorted(names)) for d, names in holders.items()}
        on_node = every_gpu(snapshot) | {m.uuid for g in snapshot.gpus for m in g.mig_devices}
        for device in self._book.forget(on_node):
            log.info("health_mark_dropped", device=device, reason="no longer on the node")
        changes: list[Change] = []
        for gpu in snapshot.gpus:  # read only in part: not vouched for, whatever events say
            if gpu.read_error and self.policy.watching:
                detail = f"read in part: {gpu.read_error}"
                changes += self._book.mark([gpu.uuid], cause=LOST, detail=detail, now=self._now())
        self._commit(changes)

    async def start(self) -> None:
        """Start watching events and re-probing (nothing when XID checks are off)."""
        for warning in self.policy.warnings:
            log.warning("health_policy_warning", detail=warning)
        if not self.policy.watching:
            log.warning("health_checks_disabled", detail=self.policy.describe())
            return
        rec = self.recovery
        log.info(
            "health_monitor_started",
            policy=self.policy.describe(),
            holddown_s=rec.holddown_s,
            max_flaps=rec.max_flaps,
            flap_window_s=rec.flap_window_s,
            fatal_xids=sorted(rec.fatal_xids),
        )
        self._thread = HealthThread(self._backend, self.handle_event, self.handle_wait_error)
        self._thread.start()
        self._timer = asyncio.create_task(self._probe_loop(), name="gpuslice-health-probe")

    async def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        thread, self._thread = self._thread, None
        if thread is not None:
            await thread.stop()

    async def __aenter__(self) -> HealthMonitor:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def handle_event(self, event: HealthEvent) -> None:
        """One backend event, on the loop."""
        fields = {"gpu": event.gpu_uuid or "unknown", "kind": event.kind, "xid": event.xid}
        if event.kind == "recovered":
            self._commit(self._book.clear(recovery_scope(event, self._snapshot), now=self._now()))
            return
        if event.kind not in (XID, LOST):
            log.info("health_event_ignored", **fields, reason="unknown kind")
            return
        if event.kind == XID:
            counted = self.policy.counts(event.xid)
            xid_class = self.recovery.severity(XID, event.xid) if counted else XID_IGNORED
            gpu = find_gpu(self._snapshot, event.gpu_uuid)
            self._metrics.xid_seen(_ref(gpu, event.gpu_uuid), event.xid, xid_class)
            if not counted:
                log.info("health_event_ignored", **fields, reason="XID skipped by policy")
                return
        devices = fault_scope(event, self._snapshot, self._advertised)
        if not devices:
            log.warning("health_event_ignored", **fields, detail=event.detail, reason="no match")
            return
        changes = self._book.mark(
            devices, cause=event.kind, xid=event.xid, detail=event.detail, now=self._now()
        )
        if not changes:
            log.info("health_event_repeated", **fields, devices=len(devices))
        self._commit(changes)

    def handle_wait_error(self, exc: Exception) -> None:
        """The event wait failed: no GPU can be vouched for until probes answer."""
        devices = every_gpu(self._snapshot)
        now = self._now()
        self._commit(self._book.mark(devices, cause=WAIT_FAILED, detail=str(exc), now=now))

    async def probe_due(self) -> None:
        """Re-probe every transient mark whose hold-down has passed."""
        async with self._probing:
            for device, seen in self._book.due(self._now()):
                try:
                    ok = await self._call(functools.partial(self._backend.probe, device))
                except Exception as exc:  # a failing probe is a GPU that does not answer
                    log.warning("health_probe_failed", device=device, error=str(exc))
                    ok = False
                self._commit(self._book.probed(device, seen, ok, now=self._now()))

    async def _probe_loop(self) -> None:
        while True:
            self._wake.clear()
            due = self._book.next_probe_at()
            if due is not None and due <= self._now():
                await self.probe_due()
                continue
            timeout = None if due is None else due - self._now()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # wait_for could swallow a cancel (3.11)
                    await self._wake.wait()

    def _now(self) -> float:
        return self._clock()

    def _publish(self) -> list[str]:
        unhealthy = self._book.unhealthy
        if unhealthy == self._published:
            return []
        self._published = unhealthy
        return self._on_change(unhealthy)

    def _commit(self, changes: list[Change]) -> None:
        changed = self._publish()
        self._wake.set()
        for change in changes:
            self._log(change, changed)

    def _log(self, change: Change, changed: list[str]) -> None:
        reason, device = change.reason, change.device
        gpu = find_gpu(self._snapshot, device)
        fields: dict[str, object] = {
            "device": device,
            "gpu": gpu.uuid if gpu else device,
            "gpu_index": gpu.index if gpu else None,
            "cause": reason.cause,
            "xid": reason.xid,
            "fault_class": reason.severity,
            "resources": list(self._holders.get(device, ())) or changed,
        }
        if reason.detail:
            fields["detail"] = reason.detail
        if change.action != "kept":
            self._metrics.health_transition(_ref(gpu, device), device, change.action, reason.cause)
        if change.action == "recovered":
            after = round(self._now() - reason.since, 3)
            log.warning("device_recovered", **fields, via=change.via, unhealthy_for_s=after)
        elif change.action == "kept":
            log.warning("device_recovery_refused", **fields, reason=change.via)
        else:
            until = _held_until(reason)
            fields.update(held_until=until, flapping=reason.flapping, probe_at=reason.probe_at)
            log.warning(f"device_{change.action}", **fields)


def _ref(gpu: Gpu | None, uuid: str) -> GpuRef:
    return GpuRef(gpu.index, gpu.uuid, gpu.name) if gpu is not None else GpuRef(None, uuid)


def _held_until(reason: Reason) -> str:
    if reason.held:
        return "agent restart"
    return "probe answers" if reason.probe_at is not None else "recovered event"
