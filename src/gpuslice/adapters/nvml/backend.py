"""NvmlBackend: the GpuBackend over the NVIDIA driver's NVML."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from gpuslice.adapters.nvml import limits
from gpuslice.adapters.nvml.events import EventWatch
from gpuslice.adapters.nvml.inventory import Inventory
from gpuslice.adapters.nvml.mig import NvmlMig
from gpuslice.adapters.nvml.processes import ProcessReader
from gpuslice.core.devices import Gpu, HardwareSnapshot, HealthEvent
from gpuslice.core.errors import BackendError
from gpuslice.core.isolation import Limit, LimitReading
from gpuslice.core.usage import ProcessSample

NVML_LIBRARY = "libnvidia-ml.so.1"
DRIVER_ROOT = "/driver-root"  # where the chart mounts nvidiaDriverRoot (upstream's default)
# Where a driver installation keeps its libraries, relative to its root.
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)

_FIXES = (
    "run the pod with runtimeClassName: nvidia, or mount the host's driver root at {root} "
    "(the chart's nvidiaDriverRoot, NVIDIA_DRIVER_ROOT)"
)


def load_nvml(
    driver_root: str | Path = DRIVER_ROOT, load: Callable[[str], Any] = ctypes.CDLL
) -> Any:
    """libnvidia-ml by name (the NVIDIA runtime puts it on the loader path), else from the
    library directories of the host driver root mounted at `driver_root`. BackendError naming
    both fixes when neither has it."""
    try:
        return load(NVML_LIBRARY)
    except OSError:
        pass
    root = Path(driver_root)
    failures = []
    for libdir in LIBRARY_DIRS:
        path = root / libdir / NVML_LIBRARY
        if not path.exists():
            continue
        try:
            return load(str(path))
        except OSError as exc:
            failures.append(f"{path}: {exc}")
    if failures:
        where = f"{NVML_LIBRARY} did not load from {root} ({'; '.join(failures)})"
    elif root.is_dir():
        where = f"{NVML_LIBRARY} is neither on the library path nor under {root}"
    else:
        where = f"{NVML_LIBRARY} is not on the library path and {root} is not mounted"
    raise BackendError(f"NVML could not be loaded: {where}; {_FIXES.format(root=root)}")


class NvmlBackend:
    """One NVML session from open() to close(). Changes a GPU only through its MIG
    control (adapters.nvml.mig), when that is called."""

    def __init__(self, nv: Any, sys_root: Path, proc_root: Path) -> None:
        self._nv = nv
        self._inventory = Inventory(nv, sys_root, proc_root)
        self._events = EventWatch(nv)
        self._unread: frozenset[str] = frozenset()  # GPUs the last snapshot read only in part
        self._processes = ProcessReader(nv)
        self._layout: tuple[Gpu, ...] | None = None  # the GPUs of the last snapshot
        self._mig = NvmlMig(nv)
        self._open = True

    @classmethod
    def open(
        cls,
        *,
        lib: Any = None,
        sys_root: str | Path = "/sys",
        proc_root: str | Path = "/proc",
        driver_root: str | Path = DRIVER_ROOT,
    ) -> NvmlBackend:
        """Initialise NVML and register for health events; BackendError when NVML
        does not load. `lib` stands in for pynvml; the roots for /sys and /proc, and
        where the host's driver root is mounted in this container."""
        nv = pynvml if lib is None else lib
        if lib is None:
            _preload(driver_root)
        try:
            nv.nvmlInit()
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise BackendError(
                    f"NVML could not be loaded ({NVML_LIBRARY}: {exc}); "
                    f"{_FIXES.format(root=driver_root)}"
                ) from None
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
        self._layout = snapshot.gpus
        return snapshot

    def processes(self) -> ProcessSample:
        """Processes per GPU and MIG device of the last snapshot (one is taken first
        if none was); errors stay on their GPU's sample."""
        if not self._open:
            raise BackendError("NVML backend used after close()")
        gpus = self._layout if self._layout is not None else self.snapshot().gpus
        return self._processes.sample(gpus)

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

    def mig_control(self) -> NvmlMig:
        return self._mig

    def process_owners(self) -> None:
        return None  # the host's cgroups say (adapters.cgroups)

    # The MemoryLimits port (adapters.nvml.limits).

    def memory_limits(self) -> NvmlBackend:
        return self

    def limit_problem(self) -> str:
        return limits.limit_problem(self._nv)

    def set_memory_limit(self, gpu_uuid: str, cgroup: str, limit: Limit) -> None:
        limits.set_limit(self._nv, gpu_uuid, cgroup, limit)

    def memory_limit(self, gpu_uuid: str, cgroup: str) -> LimitReading:
        return limits.read_limit(self._nv, gpu_uuid, cgroup)

    def clear_memory_limit(self, gpu_uuid: str, cgroup: str) -> None:
        limits.clear_limit(self._nv, gpu_uuid, cgroup)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        self._events.close()
        with contextlib.suppress(pynvml.NVMLError):  # already unusable: nothing to release
            self._nv.nvmlShutdown()


def _preload(driver_root: str | Path) -> None:
    """Hand pynvml the library found by load_nvml: pynvml itself loads only by name."""
    if pynvml.nvmlLib is not None:
        return
    library = load_nvml(driver_root)
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is None:
            pynvml.nvmlLib = library
