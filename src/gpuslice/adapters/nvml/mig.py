"""The MigControl port over NVML: profiles and placements, GPU and compute instances, the
MIG mode. The only module of the NVML adapter that changes a GPU, and only when called."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from gpuslice.adapters.nvml.inventory import text
from gpuslice.core.devices import MigEngines
from gpuslice.core.mig import (
    GpuInstance,
    MigError,
    MigProfileSpec,
    Placement,
    split_profile,
)

T = TypeVar("T")
MAX_PLACEMENTS = 32  # a profile has at most 8 (one per memory slice)
NAME_PREFIX = "MIG "
# Compute-instance profile index by compute slices (NVML_COMPUTE_INSTANCE_PROFILE_*).
CI_PROFILES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
_CODES = {
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "INSUFFICIENT_RESOURCES",
    pynvml.NVML_ERROR_IN_USE: "IN_USE",
    pynvml.NVML_ERROR_RESET_REQUIRED: "RESET_REQUIRED",
    pynvml.NVML_ERROR_NO_PERMISSION: "NO_PERMISSION",
    pynvml.NVML_ERROR_NOT_FOUND: "NOT_FOUND",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "NOT_SUPPORTED",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "INVALID_ARGUMENT",
}


def code(value: int) -> str:
    """NVML's name of an error code ("ERROR_<n>" for one without a name here)."""
    return _CODES.get(value, f"ERROR_{value}")


def _call(what: str, fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise MigError(code(exc.value), f"{what}: {exc}") from None


class NvmlMig:
    """MIG control of the GPUs NVML sees; `nv` is pynvml or a stand-in with its calls."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv

    def profiles(self, gpu_uuid: str) -> tuple[MigProfileSpec, ...]:
        handle = self._handle(gpu_uuid)
        return tuple(self._spec(handle, info) for info in self._infos(handle))

    def instances(self, gpu_uuid: str) -> tuple[GpuInstance, ...]:
        nv, handle = self._nv, self._handle(gpu_uuid)
        devices = self._mig_devices(handle)  # (gi, ci) -> (MIG UUID, compute slices)
        names = {int(info.id): (_name(info), int(info.sliceCount)) for info in self._infos(handle)}
        found = []
        for profile_id, (name, slices) in names.items():
            for gi in self._gpu_instances(handle, profile_id):
                info = _call("read a GPU instance", nv.nvmlGpuInstanceGetInfo, gi)
                placement = Placement(int(info.placement.start), int(info.placement.size))
                gi_id = int(info.id)
                mine = sorted((c, d) for (g, c), d in devices.items() if g == gi_id)
                for ci, (uuid, compute) in mine or [(-1, ("", slices))]:
                    profile = name if compute >= slices else f"{compute}c.{name}"
                    found.append(GpuInstance(profile, placement, gi_id, ci, uuid))
        return tuple(sorted(found, key=lambda i: (i.placement, i.ci)))

    def mig_mode(self, gpu_uuid: str) -> tuple[bool, bool]:
        current, pending = _call(
            "read the MIG mode", self._nv.nvmlDeviceGetMigMode, self._handle(gpu_uuid)
        )
        on = pynvml.NVML_DEVICE_MIG_ENABLE
        return current == on, pending == on

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        what = f"GPU {gpu_uuid}: MIG mode {'on' if enabled else 'off'}"
        status = _call(what, self._nv.nvmlDeviceSetMigMode, self._handle(gpu_uuid), mode)
        if status != pynvml.NVML_SUCCESS:  # taken, but the reset that applies it failed
            raise MigError(code(status), f"{what}: left pending")

    def create(self, gpu_uuid: str, profile: str, start: int) -> GpuInstance:
        nv, handle = self._nv, self._handle(gpu_uuid)
        what = f"GPU {gpu_uuid}: create {profile} at {start}"
        base, compute, _ = split_profile(profile)
        info = next((i for i in self._infos(handle) if _name(i) == base), None)
        if info is None or compute not in CI_PROFILES:
            raise MigError("INVALID_ARGUMENT", f"{what}: the GPU has no such profile")
        options = self._placements(handle, int(info.id))
        chosen = next((p for p in options if p.start == start), None)
        if chosen is None:
            raise MigError("INVALID_ARGUMENT", f"{what}: not a placement of {base}")
        placement = nv.c_nvmlGpuInstancePlacement_t(chosen.start, chosen.size)
        create = nv.nvmlDeviceCreateGpuInstanceWithPlacement  # the C call takes a pointer
        gi = _call(what, create, handle, info.id, ctypes.byref(placement))
        try:
            shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            ci_info = _call(
                what,
                nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                CI_PROFILES[compute],
                shared,
            )
            ci = _call(what, nv.nvmlGpuInstanceCreateComputeInstance, gi, ci_info.id)
            ci_read = _call(what, nv.nvmlComputeInstanceGetInfo, ci)
            uuid = text(_call(what, nv.nvmlDeviceGetUUID, ci_read.device))
            gi_id = int(_call(what, nv.nvmlGpuInstanceGetInfo, gi).id)
        except MigError:
            with contextlib.suppress(MigError):  # leave no GPU instance without its CI
                self._destroy(gi, what)
            raise
        return GpuInstance(profile, chosen, gi_id, int(ci_read.id), uuid)

    def destroy(self, gpu_uuid: str, gi: int) -> None:
        what = f"GPU {gpu_uuid}: destroy GPU instance {gi}"
        try:
            instance = self._nv.nvmlDeviceGetGpuInstanceById(self._handle(gpu_uuid), gi)
        except pynvml.NVMLError_NotFound:
            return
        except pynvml.NVMLError as exc:
            raise MigError(code(exc.value), f"{what}: {exc}") from None
        self._destroy(instance, what)

    def _destroy(self, instance: Any, what: str) -> None:
        nv = self._nv
        for index in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    instance, index, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except pynvml.NVMLError:
                continue
            for ci in _listed(
                nv.nvmlGpuInstanceGetComputeInstances,
                instance,
                int(info.id),
                nv.c_nvmlComputeInstance_t,
            ):
                _call(what, nv.nvmlComputeInstanceDestroy, ci)
        _call(what, nv.nvmlGpuInstanceDestroy, instance)

    def _handle(self, gpu_uuid: str) -> Any:
        return _call(f"GPU {gpu_uuid}", self._nv.nvmlDeviceGetHandleByUUID, gpu_uuid)

    def _infos(self, handle: Any) -> list[Any]:
        """The GPU-instance profile infos the GPU has (absent ones skipped)."""
        infos = []
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                infos.append(self._nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, index))
            except pynvml.NVMLError:
                continue
        return infos

    def _spec(self, handle: Any, info: Any) -> MigProfileSpec:
        return MigProfileSpec(
            name=_name(info),
            gi_profile_id=int(info.id),
            memory_mib=int(info.memorySizeMB),
            multiprocessors=int(info.multiprocessorCount),
            slices=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            placements=self._placements(handle, int(info.id)),
            engines=MigEngines(
                copy=int(info.copyEngineCount),
                decoder=int(info.decoderCount),
                encoder=int(info.encoderCount),
                jpeg=int(info.jpegCount),
                ofa=int(info.ofaCount),
            ),
        )

    def _placements(self, handle: Any, profile_id: int) -> tuple[Placement, ...]:
        nv = self._nv
        found = (nv.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        _call(
            f"placements of GPU-instance profile {profile_id}",
            nv.nvmlDeviceGetGpuInstancePossiblePlacements,
            handle,
            profile_id,
            found,
            ctypes.byref(count),
        )
        n = min(count.value, MAX_PLACEMENTS)
        return tuple(sorted(Placement(int(p.start), int(p.size)) for p in found[:n]))

    def _gpu_instances(self, handle: Any, profile_id: int) -> list[Any]:
        return _listed(
            self._nv.nvmlDeviceGetGpuInstances, handle, profile_id, self._nv.c_nvmlGpuInstance_t
        )

    def _mig_devices(self, handle: Any) -> dict[tuple[int, int], tuple[str, int]]:
        nv, found = self._nv, {}
        for slot in range(_call("count MIG devices", nv.nvmlDeviceGetMaxMigDeviceCount, handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                gi, ci = nv.nvmlDeviceGetGpuInstanceId(mig), nv.nvmlDeviceGetComputeInstanceId(mig)
                compute = int(nv.nvmlDeviceGetAttributes(mig).computeInstanceSliceCount)
                found[(int(gi), int(ci))] = (text(nv.nvmlDeviceGetUUID(mig)), compute)
            except pynvml.NVMLError_NotFound:
                continue
            except pynvml.NVMLError as exc:
                raise MigError(code(exc.value), f"read MIG device {slot}: {exc}") from None
        return found


def _listed(fn: Callable[..., Any], parent: Any, profile_id: int, kind: Any) -> list[Any]:
    """The instances of one profile an NVML list call fills in (at most 8)."""
    found = (kind * 8)()
    count = ctypes.c_uint(8)
    _call("list instances", fn, parent, profile_id, found, ctypes.byref(count))
    return list(found[: min(count.value, 8)])


def _name(info: Any) -> str:
    return text(info.name).removeprefix(NAME_PREFIX).strip()
