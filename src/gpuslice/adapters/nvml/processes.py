"""Per-process samples from NVML: only the calls that read processes and use.

Per GPU: the compute, MPS-compute and graphics processes (merged by pid), their
SM utilisation since the previous sample (nvmlDeviceGetProcessUtilization, with
the last timestamp carried), the GPU's memory in use and utilisation. On a MIG
GPU, each MIG device's processes through its own handle; NVML has no per-process
utilisation there. An error on one GPU is kept on that GPU's sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from gpuslice.adapters.nvml.inventory import ABSENT, optional
from gpuslice.core.devices import Gpu
from gpuslice.core.usage import (
    UTIL_MIG,
    UTIL_UNREADABLE,
    UTIL_UNSUPPORTED,
    DeviceProcesses,
    GpuSample,
    ProcessSample,
    ProcessUse,
)

RUNNING = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
)


class ProcessReader:
    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self._seen: dict[str, int] = {}  # GPU UUID -> the newest utilisation timestamp (µs)

    def sample(self, gpus: Sequence[Gpu]) -> ProcessSample:
        return ProcessSample(tuple(self._gpu(g) for g in gpus))

    def _gpu(self, gpu: Gpu) -> GpuSample:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
            used = int(nv.nvmlDeviceGetMemoryInfo(handle).used)
            if gpu.mig_enabled:
                devices = tuple(
                    DeviceProcesses(
                        m.uuid, self._running(nv.nvmlDeviceGetHandleByUUID(m.uuid)), UTIL_MIG
                    )
                    for m in gpu.mig_devices
                )
                return GpuSample(gpu.uuid, devices, used, None, UTIL_MIG)
            running = self._running(handle)
            utils, absent = self._process_util(gpu.uuid, handle)
            procs = tuple(
                ProcessUse(p.pid, p.memory_bytes, None if absent else utils.get(p.pid, 0.0))
                for p in running
            )
            util, util_absent = _device_util(nv, handle)
            return GpuSample(
                gpu.uuid, (DeviceProcesses(gpu.uuid, procs, absent),), used, util, util_absent
            )
        except pynvml.NVMLError as exc:
            return GpuSample(gpu.uuid, error=f"GPU {gpu.index}: {exc}")

    def _running(self, handle: Any) -> tuple[ProcessUse, ...]:
        """Every kind of process context on the handle, one entry per pid."""
        memory: dict[int, int] = {}
        for call in RUNNING:
            fn: Callable[..., Any] | None = getattr(self._nv, call, None)
            if fn is None:
                continue
            for p in optional(fn, handle) or ():
                pid = int(p.pid)
                # None: the driver does not say (NVML_VALUE_NOT_AVAILABLE).
                memory[pid] = max(memory.get(pid, 0), int(p.usedGpuMemory or 0))
        return tuple(ProcessUse(pid, mem) for pid, mem in sorted(memory.items()))

    def _process_util(self, uuid: str, handle: Any) -> tuple[dict[int, float], str]:
        """pid -> SM utilisation 0..1 since the last sample, or the reason it is absent."""
        try:
            samples = self._nv.nvmlDeviceGetProcessUtilization(handle, self._seen.get(uuid, 0))
        except ABSENT:
            return {}, UTIL_UNSUPPORTED
        except pynvml.NVMLError_NotFound:
            return {}, ""  # no process used the GPU since the last sample
        except pynvml.NVMLError:
            return {}, UTIL_UNREADABLE
        utils: dict[int, float] = {}
        for s in samples:
            pid = int(s.pid)
            utils[pid] = max(utils.get(pid, 0.0), min(1.0, int(s.smUtil) / 100))
            self._seen[uuid] = max(self._seen.get(uuid, 0), int(s.timeStamp))
        return utils, ""


def _device_util(nv: Any, handle: Any) -> tuple[float | None, str]:
    try:
        return int(nv.nvmlDeviceGetUtilizationRates(handle).gpu) / 100, ""
    except ABSENT:
        return None, UTIL_UNSUPPORTED
    except pynvml.NVMLError:
        return None, UTIL_UNREADABLE
