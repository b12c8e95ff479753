"""The driver's per-cgroup GPU memory limits (r615) through NVML: set, read back and
clear one cgroup's limits on one GPU. Nothing else on the GPU is ever changed."""

from __future__ import annotations

from typing import Any

import pynvml

from gpuslice.core.errors import BackendError
from gpuslice.core.isolation import UNLIMITED, Limit, LimitReading, driver_problem

SET_CALL = "nvmlDeviceSetMemoryLimits_v1"
GET_CALL = "nvmlDeviceGetMemoryLimits_v1"


def limit_problem(nv: Any) -> str:
    """Why this driver cannot set limits ("" when it can): its version, or the library
    lacking the calls (the function pointers are looked up, never called)."""
    try:
        version = nv.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError as exc:
        return f"the driver version cannot be read ({exc})"
    if isinstance(version, bytes):
        version = version.decode(errors="replace")
    has_calls = True
    for name in (SET_CALL, GET_CALL):
        try:
            nv._nvmlGetFunctionPointer(name)
        except (pynvml.NVMLError, AttributeError):
            has_calls = False
    return driver_problem(str(version), has_calls)


def set_limit(nv: Any, gpu_uuid: str, cgroup: str, limit: Limit) -> None:
    soft = min(limit.soft, limit.hard)
    _call(nv, gpu_uuid, SET_CALL, nv.c_nvmlSetMemoryLimits_v1_t(cgroup.encode(), soft, limit.hard))


def read_limit(nv: Any, gpu_uuid: str, cgroup: str) -> LimitReading:
    out = nv.c_nvmlGetMemoryLimits_v1_t(cgroup.encode(), 0, 0, 0)
    _call(nv, gpu_uuid, GET_CALL, out)
    return LimitReading(int(out.softLimit), int(out.hardLimit), int(out.currentUsed))


def clear_limit(nv: Any, gpu_uuid: str, cgroup: str) -> None:
    """NVIDIA's documented clearing: soft 0, hard NVML_DEVICE_MEMORY_LIMIT_MAX."""
    _call(nv, gpu_uuid, SET_CALL, nv.c_nvmlSetMemoryLimits_v1_t(cgroup.encode(), 0, UNLIMITED))


def _call(nv: Any, gpu_uuid: str, name: str, value: Any) -> None:
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        getattr(nv, name)(handle, value)
    except pynvml.NVMLError as exc:
        raise BackendError(f"{name} on {gpu_uuid} failed: {exc}", transient=True) from None
