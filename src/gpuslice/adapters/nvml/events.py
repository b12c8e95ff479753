"""NVML health events: one event set with XID and ECC events of every GPU.

XID -> kind "xid" with the code; double-bit ECC -> "xid" 48 (as upstream files
it); single-bit ECC (corrected by the hardware) is not reported. When NVML says
a GPU is lost, each watched GPU is probed and the unreachable ones reported as
"lost". `detail` holds space-separated tokens: "ecc=double-bit" and, for a
MIG-scoped event, "gi=<id> ci=<id>". A GPU whose events cannot be registered
is reported lost, and its probes fail until a retry registers them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import pynvml
import structlog

from gpuslice.adapters.nvml.inventory import ABSENT, text
from gpuslice.core.devices import HealthEvent
from gpuslice.core.errors import BackendError

_log = structlog.get_logger()

HEALTH_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
DOUBLE_BIT_ECC_XID = 48
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of an event outside MIG
WAIT_SLICE_S = 1.0  # longest single NVML wait, so close() never waits longer


class EventWatch:
    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self._lock = threading.Lock()  # the event set's lifetime: wait vs. close
        self._closed = threading.Event()
        self._event_set: Any = None
        self._watched: dict[str, Any] = {}  # GPU UUID -> handle
        self.registered: list[str] = []  # GPUs whose health events are registered
        self._unwatched: set[str] = set()  # GPUs whose registration failed
        self._lost: set[str] = set()
        self._pending: deque[HealthEvent] = deque()

    def register(self) -> None:
        """Watch every GPU for the health events it supports. A GPU NVML cannot
        name is skipped here (watch() takes it once a snapshot names it)."""
        nv = self._nv
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            _log.warning("nvml_events_unavailable", reason=str(exc))
            return
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                gpu_uuid = text(nv.nvmlDeviceGetUUID(handle))
            except pynvml.NVMLError as exc:
                _log.warning("nvml_health_events_gpu_unnamed", gpu_index=index, error=str(exc))
                continue
            self._add(gpu_uuid, handle)

    def watch(self, gpu_uuid: str) -> None:
        """Watch a GPU not seen before (one register() could not name)."""
        if self._event_set is None or gpu_uuid in self._watched or gpu_uuid in self._unwatched:
            return
        try:
            handle = self._nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except pynvml.NVMLError as exc:
            self._failed(gpu_uuid, str(exc))
            return
        self._add(gpu_uuid, handle)

    def watching(self, gpu_uuid: str) -> bool:
        """False while the GPU's health events cannot be registered; each call
        retries, so a GPU is never declared healthy unwatched."""
        if gpu_uuid not in self._unwatched:
            return True
        try:
            handle = self._nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except pynvml.NVMLError:
            return False
        with self._lock:
            if self._event_set is None or self._register(gpu_uuid, handle):
                return False
        self._unwatched.discard(gpu_uuid)
        return True

    def report(self, event: HealthEvent) -> None:
        """Queue an event found outside the event set (an unreadable GPU)."""
        self._pending.append(event)

    def _add(self, gpu_uuid: str, handle: Any) -> None:
        """A GPU that cannot be registered (other than for lack of support) is
        reported lost, as upstream marks it unhealthy, and watching() keeps it so."""
        with self._lock:
            error = self._register(gpu_uuid, handle) if self._event_set is not None else ""
        if error:
            self._failed(gpu_uuid, error)

    def _register(self, gpu_uuid: str, handle: Any) -> str:
        """Register one GPU's health events (under the lock); the NVML error, or ""."""
        self._watched[gpu_uuid] = handle
        try:
            wanted = int(self._nv.nvmlDeviceGetSupportedEventTypes(handle)) & HEALTH_EVENTS
            if wanted:
                self._nv.nvmlDeviceRegisterEvents(handle, wanted, self._event_set)
                self.registered.append(gpu_uuid)
        except ABSENT:
            _log.warning("nvml_health_events_unsupported", device=gpu_uuid)
        except pynvml.NVMLError as exc:
            return str(exc)
        return ""

    def _failed(self, gpu_uuid: str, error: str) -> None:
        self._unwatched.add(gpu_uuid)
        detail = f"health event registration failed: {error}"
        self._pending.append(HealthEvent(gpu_uuid=gpu_uuid, kind="lost", detail=detail))

    def wait(self, timeout_s: float) -> HealthEvent | None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while not self._pending and not self._closed.is_set():
            remaining = max(deadline - time.monotonic(), 0.0)
            if self._event_set is None:  # nothing to watch here
                self._closed.wait(remaining)
                return None
            event = self._wait_once(min(remaining, WAIT_SLICE_S))
            if event is not None:
                return event
            if time.monotonic() >= deadline:
                return None
        return self._pending.popleft() if self._pending else None

    def answering(self, gpu_uuid: str) -> None:
        """A probe saw the GPU answer: a later loss is news again."""
        self._lost.discard(gpu_uuid)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            event_set, self._event_set = self._event_set, None
        if event_set is not None:
            try:
                self._nv.nvmlEventSetFree(event_set)
            except pynvml.NVMLError as exc:
                _log.debug("nvml_event_set_free_failed", reason=str(exc))

    def _wait_once(self, slice_s: float) -> HealthEvent | None:
        """One bounded NVML wait; after a lost GPU with nothing new to report,
        sleep out the slice instead of spinning on the same error."""
        with self._lock:
            if self._event_set is None:
                return None
            try:
                data = self._nv.nvmlEventSetWait_v2(self._event_set, int(slice_s * 1000))
            except pynvml.NVMLError_Timeout:
                return None
            except pynvml.NVMLError_GpuIsLost:
                data = None
            except pynvml.NVMLError as exc:
                raise BackendError(f"NVML event wait failed: {exc}", transient=True) from None
            if data is not None:
                return self._to_event(data)
            newly_lost = self._find_lost()
        if not newly_lost:
            self._closed.wait(slice_s)
        return None

    def _find_lost(self) -> bool:
        found = False
        for gpu_uuid, handle in self._watched.items():
            if gpu_uuid in self._lost:
                continue
            try:
                self._nv.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                self._lost.add(gpu_uuid)
                self._pending.append(HealthEvent(gpu_uuid=gpu_uuid, kind="lost", detail=str(exc)))
                found = True
        return found

    def _to_event(self, data: Any) -> HealthEvent | None:
        try:
            gpu_uuid = text(self._nv.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            gpu_uuid = ""  # the event's GPU cannot be named
        scope = []
        if NO_INSTANCE not in (data.gpuInstanceId, data.computeInstanceId):
            scope = [f"gi={data.gpuInstanceId}", f"ci={data.computeInstanceId}"]
        kind = int(data.eventType)
        if kind & pynvml.nvmlEventTypeXidCriticalError:
            return HealthEvent(gpu_uuid, "xid", xid=int(data.eventData), detail=" ".join(scope))
        if kind & pynvml.nvmlEventTypeDoubleBitEccError:
            detail = " ".join(["ecc=double-bit", *scope])
            return HealthEvent(gpu_uuid, "xid", xid=DOUBLE_BIT_ECC_XID, detail=detail)
        return None
