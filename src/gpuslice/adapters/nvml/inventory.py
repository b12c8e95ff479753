"""NVML device queries -> a HardwareSnapshot of core values.

Read-only: no NVML set* call anywhere. NotSupported and FunctionNotFound mean
"feature absent". `nv` is pynvml or any object with its functions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import structlog

from gpuslice.adapters.nvml.host import (
    MIG_MINORS,
    mig_cap_paths,
    normal_bus_id,
    read_machine,
    read_mig_minors,
    read_numa_node,
    read_pcie_root,
)
from gpuslice.core.devices import Gpu, GpuProcess, HardwareSnapshot, MigDevice, MigEngines
from gpuslice.core.errors import BackendError

_log = structlog.get_logger()

MIB = 1024 * 1024
ABSENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)
ARCHITECTURES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}
BRANDS = {
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GRID: "GRID",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_QUADRO_RTX: "Quadro RTX",
    pynvml.NVML_BRAND_NVIDIA_RTX: "NVIDIA RTX",
    pynvml.NVML_BRAND_NVIDIA: "NVIDIA",
}


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def optional(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None where the GPU or driver lacks the feature."""
    try:
        return fn(*args)
    except ABSENT:
        return None


def informational(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None on any NVML error: for facts nothing depends on."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def profile_from_size(slices: int, mig_mib: int, gpu_mib: int) -> str:
    """Name a GPU-instance profile from its size where the driver does not name
    it: memory rounds up to eighths of the GPU, then to whole GB ("1g.5gb")."""
    eighths = math.ceil(mig_mib / gpu_mib * 8)
    return f"{slices}g.{round(gpu_mib * eighths / 8 / 1024)}gb"


class Inventory:
    def __init__(self, nv: Any, sys_root: Path, proc_root: Path) -> None:
        self._nv = nv
        self._sys_root = sys_root
        self._proc_root = proc_root

    def snapshot(self) -> HardwareSnapshot:
        """Every GPU read in full, or kept with what identifies it (read_error
        set); a GPU not even that far readable is left out with a warning.
        BackendError when enumeration fails or no GPU reads in full."""
        nv = self._nv
        try:
            count = nv.nvmlDeviceGetCount()
            driver = text(nv.nvmlSystemGetDriverVersion())
            nvml_version = text(nv.nvmlSystemGetNVMLVersion())
            cuda = optional(nv.nvmlSystemGetCudaDriverVersion) or 0
        except pynvml.NVMLError as exc:
            raise BackendError(f"NVML enumeration failed: {exc}", transient=True) from None
        caps = read_mig_minors(self._proc_root)
        read = [self._read(i, caps) for i in range(count)]
        kept = [r for r in read if not isinstance(r, str)]
        if count and all(g.read_error for g, _ in kept):
            errors = "; ".join(r if isinstance(r, str) else r[0].read_error for r in read)
            raise BackendError(f"NVML: no GPU could be read ({errors})", transient=True)
        gpus = [g for g, _ in kept]
        links = nvlink_peers(gpus, [self._link_remotes(h) for _, h in kept])
        return HardwareSnapshot(
            gpus=tuple(replace(g, nvlinks=peers) for g, peers in zip(gpus, links, strict=True)),
            driver_version=driver,
            nvml_version=nvml_version,
            cuda_driver_version=int(cuda),
            machine=read_machine(self._sys_root),
            extra={"backend": "nvml"},
        )

    def _read(self, index: int, caps: dict[str, int]) -> tuple[Gpu, Any] | str:
        """(GPU, handle), or why GPU `index` is left out."""
        try:
            handle = self._nv.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            error = f"GPU {index}: {exc}"
        else:
            try:
                return self._gpu(index, handle, caps), handle
            except (pynvml.NVMLError, BackendError) as exc:
                error = f"GPU {index}: {exc}"
            gpu = self._partial(index, handle, error)
            if gpu is not None:
                _log.warning("gpu_partly_read", gpu_index=index, gpu=gpu.uuid, error=error)
                return gpu, handle
        _log.warning("gpu_left_out", gpu_index=index, error=error)
        return error

    def _partial(self, index: int, handle: Any, error: str) -> Gpu | None:
        """What identifies a GPU that failed a full read: None without its UUID
        and minor number, or when MIG is on or unknown (its MIG devices, what
        would be served, are not known)."""
        nv = self._nv
        gpu_uuid = informational(nv.nvmlDeviceGetUUID, handle)
        minor = informational(nv.nvmlDeviceGetMinorNumber, handle)
        try:
            mig_mode = optional(nv.nvmlDeviceGetMigMode, handle)
        except pynvml.NVMLError:
            return None
        if gpu_uuid is None or minor is None or _enabled(mig_mode):
            return None
        pci = informational(nv.nvmlDeviceGetPciInfo, handle)
        bus_id = normal_bus_id(text(pci.busId)) if pci is not None else ""
        name = informational(nv.nvmlDeviceGetName, handle)
        memory = informational(nv.nvmlDeviceGetMemoryInfo, handle)
        capability = informational(nv.nvmlDeviceGetCudaComputeCapability, handle) or (0, 0)
        return Gpu(
            index=index,
            uuid=text(gpu_uuid),
            name="" if name is None else text(name),
            minor=int(minor),
            memory_mib=0 if memory is None else int(memory.total) // MIB,
            compute_capability=(int(capability[0]), int(capability[1])),
            pci_bus_id=bus_id,
            numa_node=read_numa_node(self._sys_root, bus_id) if bus_id else None,
            mig_capable=mig_mode is not None,
            read_error=error,
        )

    def _gpu(self, index: int, handle: Any, caps: dict[str, int]) -> Gpu:
        """Every fact of one GPU; raises NVMLError or BackendError."""
        nv = self._nv
        pci = nv.nvmlDeviceGetPciInfo(handle)
        bus_id = normal_bus_id(text(pci.busId))
        minor = int(nv.nvmlDeviceGetMinorNumber(handle))
        memory_mib = int(nv.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        major, minor_cc = nv.nvmlDeviceGetCudaComputeCapability(handle)
        mig_mode = optional(nv.nvmlDeviceGetMigMode, handle)
        mig_enabled = _enabled(mig_mode)
        attributes = informational(nv.nvmlDeviceGetAttributes, handle)
        return Gpu(
            index=index,
            uuid=text(nv.nvmlDeviceGetUUID(handle)),
            name=text(nv.nvmlDeviceGetName(handle)),
            minor=minor,
            memory_mib=memory_mib,
            compute_capability=(int(major), int(minor_cc)),
            pci_bus_id=bus_id,
            pci_device_id=int(pci.pciDeviceId),
            pci_subsystem_id=int(pci.pciSubSystemId),
            numa_node=read_numa_node(self._sys_root, bus_id),
            pcie_root=read_pcie_root(self._sys_root, bus_id),
            brand=BRANDS.get(informational(nv.nvmlDeviceGetBrand, handle), ""),
            architecture=ARCHITECTURES.get(informational(nv.nvmlDeviceGetArchitecture, handle), ""),
            multiprocessors=int(attributes.multiprocessorCount) if attributes else 0,
            mig_capable=mig_mode is not None,
            mig_enabled=mig_enabled,
            mig_devices=self._migs(handle, minor, memory_mib, caps) if mig_enabled else (),
            processes=self._processes(handle),
        )

    def _migs(
        self, parent: Any, minor: int, gpu_mib: int, caps: dict[str, int]
    ) -> tuple[MigDevice, ...]:
        nv = self._nv
        names = self._gi_profile_names(parent)
        found: list[MigDevice] = []
        for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(parent)):
            try:
                handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except pynvml.NVMLError_NotFound:
                continue
            gi = int(nv.nvmlDeviceGetGpuInstanceId(handle))
            ci = int(nv.nvmlDeviceGetComputeInstanceId(handle))
            attributes = nv.nvmlDeviceGetAttributes(handle)
            mig_uuid = text(nv.nvmlDeviceGetUUID(handle))
            cap_paths = mig_cap_paths(caps, minor, gi, ci)
            if cap_paths is None:
                where = self._proc_root / MIG_MINORS
                raise BackendError(f"MIG device {mig_uuid}: no gi{gi}/ci{ci} access in {where}")
            found.append(
                MigDevice(
                    uuid=mig_uuid,
                    index=len(found),
                    profile=self._mig_profile(parent, gi, attributes, names, gpu_mib),
                    gi=gi,
                    ci=ci,
                    memory_mib=int(nv.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                    multiprocessors=int(attributes.multiprocessorCount),
                    cap_paths=cap_paths,
                    gi_slices=int(attributes.gpuInstanceSliceCount),
                    ci_slices=int(attributes.computeInstanceSliceCount),
                    engines=MigEngines(
                        copy=int(attributes.sharedCopyEngineCount),
                        decoder=int(attributes.sharedDecoderCount),
                        encoder=int(attributes.sharedEncoderCount),
                        jpeg=int(attributes.sharedJpegCount),
                        ofa=int(attributes.sharedOfaCount),
                    ),
                )
            )
        return tuple(found)

    def _gi_profile_names(self, parent: Any) -> dict[int, str]:
        """GPU-instance profile id -> name ("1g.5gb"), where the driver names them."""
        names: dict[int, str] = {}
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self._nv.nvmlDeviceGetGpuInstanceProfileInfo(parent, index)
            except pynvml.NVMLError:
                continue
            name = text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
            if name:
                names[int(info.id)] = name
        return names

    def _mig_profile(
        self, parent: Any, gi: int, attributes: Any, names: dict[int, str], gpu_mib: int
    ) -> str:
        slices = int(attributes.gpuInstanceSliceCount)
        compute = int(attributes.computeInstanceSliceCount)
        try:
            instance = self._nv.nvmlDeviceGetGpuInstanceById(parent, gi)
            name = names.get(int(self._nv.nvmlGpuInstanceGetInfo(instance).profileId))
        except pynvml.NVMLError:  # e.g. no permission to read GPU instances
            name = None
        name = name or profile_from_size(slices, int(attributes.memorySizeMB), gpu_mib)
        return name if compute >= slices else f"{compute}c.{name}"

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        # Informational only; a MIG-enabled parent may refuse the query.
        running = informational(self._nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return tuple(GpuProcess(int(p.pid), int(p.usedGpuMemory or 0) // MIB) for p in running)

    def _link_remotes(self, handle: Any) -> list[str]:
        """Remote PCI bus ID of each active NVLink; none where NVLink is absent.
        Links only guide placement, so an error ends the scan instead of failing."""
        remotes = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if self._nv.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                info = self._nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except pynvml.NVMLError:  # NotSupported, or past the last link
                break
            remotes.append(normal_bus_id(text(info.busId)))
        return remotes


def nvlink_peers(
    gpus: Sequence[Gpu], remotes: Sequence[Sequence[str]]
) -> list[tuple[tuple[str, int], ...]]:
    """(peer UUID, links) per GPU from each GPU's link remotes, by position. A
    remote that is a GPU is a direct link; any other remote is an NVSwitch, and
    two GPUs reaching the same switches are joined by the fewer of their links
    to them."""
    at_bus = {g.pci_bus_id: i for i, g in enumerate(gpus) if g.pci_bus_id}
    direct = [Counter[int]() for _ in gpus]
    switched = [Counter[str]() for _ in gpus]
    for i, bus_ids in enumerate(remotes):
        for remote in bus_ids:
            peer = at_bus.get(remote)
            if peer is None:
                switched[i][remote] += 1
            elif peer != i:
                direct[i][peer] += 1
    peers: list[tuple[tuple[str, int], ...]] = []
    for a in range(len(gpus)):
        found = []
        for b, other in enumerate(gpus):
            shared = switched[a].keys() & switched[b].keys()
            via = min(sum(switched[g][s] for s in shared) for g in (a, b))
            count = max(direct[a][b], direct[b][a]) + via
            if b != a and count:
                found.append((other.uuid, count))
        peers.append(tuple(found))
    return peers


def _enabled(mig_mode: Any) -> bool:
    return mig_mode is not None and mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
