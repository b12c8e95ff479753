"""NvmlBackend: the GpuBackend over the NVIDIA driver's NVML."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pynvml

from gpuslice.adapters.nvml.events import EventWatch
from gpuslice.adapters.nvml.inventory import Inventory
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.errors import BackendError


class NvmlBackend:
    """One NVML session from open() to close(). Never changes a GPU setting."""

    def __init__(self, nv: Any, sys_root: Path, proc_root: Path) -> None:
        self._nv = nv
        self._inventory = Inventory(nv, sys_root, proc_root)
        self._events = EventWatch(nv)
        self._unread: frozenset[str] = frozenset()  # GPUs the last snapshot read only in part
        self._open = True

    @classmethod
    def open(
        cls, *, lib: Any = None, sys_root: str | Path = "/sys", proc_root: str | Path = "/proc"
    ) -> NvmlBackend:
        """Initialise NVML and register for health events; BackendError when NVML
        does not load. `lib` stands in for pynvml; the roots for /sys and /proc."""
        nv = pynvml if lib is None else lib
        try:
            nv.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendError(
                f"NVML did not initialise ({exc}): no NVIDIA driver or GPU is visible here"
            ) from None
        backend = cls(nv, Path(sys_root), Path(proc_root))
        try:
            backend._events.register()
        except pynvml.NVMLError as exc:
            backend.close()
            raise BackendError(f"NVML health event setup failed: {exc}", transient=True) from None
        return backend

    @property
    def watched_gpus(self) -> tuple[str, ...]:
        """UUIDs of the GPUs whose XID/ECC events this backend receives."""
        return tuple(self._events.registered)

    def snapshot(self) -> HardwareSnapshot:
        """The GPUs as read now; each GPU newly read only in part is reported lost."""
        if not self._open:
            raise BackendError("NVML backend used after close()")
        snapshot = self._inventory.snapshot()
        unread = {g.uuid: g.read_error for g in snapshot.gpus if g.read_error}
        for gpu in snapshot.gpus:
            self._events.watch(gpu.uuid)
        for gpu_uuid in unread.keys() - self._unread:
            detail = f"unreadable: {unread[gpu_uuid]}"
            self._events.report(HealthEvent(gpu_uuid, "lost", detail=detail))
        self._unread = frozenset(unread)
        return snapshot

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        return self._events.wait(timeout_s)

    def probe(self, gpu_uuid: str) -> bool:
        """The GPU (or MIG device) answers a memory query right now, the last
        snapshot read it in full, and its health events are registered."""
        if not self._open or gpu_uuid in self._unread:  # only a full read clears these
            return False
        try:
            self._nv.nvmlDeviceGetMemoryInfo(self._nv.nvmlDeviceGetHandleByUUID(gpu_uuid))
        except pynvml.NVMLError:
            return False
        if not self._events.watching(gpu_uuid):
            return False
        self._events.answering(gpu_uuid)
        return True

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._events.close()
        with contextlib.suppress(pynvml.NVMLError):  # already unusable: nothing to release
            self._nv.nvmlShutdown()
