"""A behavioural stand-in for pynvml that serves one HardwareSnapshot.

It implements only the read calls NvmlBackend uses (a set* call would fail
with AttributeError), raises pynvml's own error classes, and lets a test
inject XID/ECC events, lost GPUs and per-GPU call failures. `host_tree` writes the matching /sys and
/proc files, so NvmlBackend over FakeNvml should reproduce the snapshot.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml

from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.core.devices import Gpu, HardwareSnapshot, MigDevice
from gpuslice.core.mig import GpuInstance, MigProfileSpec, split_profile

MIB = 1024 * 1024
NO_INSTANCE = 0xFFFFFFFF
SWITCHES = 6  # NVSwitch chips a switched GPU spreads its links over
_BRANDS: dict[str, int] = {"NVIDIA": pynvml.NVML_BRAND_NVIDIA, "Tesla": pynvml.NVML_BRAND_TESLA}
_ARCHS: dict[str, int] = {
    "Turing": pynvml.NVML_DEVICE_ARCH_TURING,
    "Ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "Hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
}


def fail(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class Dev:
    gpu: Gpu
    mig: MigDevice | None = None


@dataclass
class EventSet:
    queue: list[SimpleNamespace] = field(default_factory=list)
    registered: dict[str, int] = field(default_factory=dict)
    freed: bool = False


class FakeNvml:
    """`switch_links`: serve every NVLink as going to an NVSwitch, that many per
    GPU (how DGX systems look); otherwise peers are served as direct links.
    `faults`: (NVML function name, GPU index) -> the NVML error code that call
    raises for that GPU (and its MIG devices) while the entry is there.
    `mig_profiles`: the GPU-instance profiles every MIG-capable GPU reports (with their
    placements), and `mig_instances` each GPU's instances (GPU UUID -> instances), for
    the MIG control's reads."""

    c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t  # noqa: N815 - pynvml's
    c_nvmlGpuInstance_t = ctypes.py_object  # noqa: N815 - the handles: GpuInstance values

    def __init__(
        self,
        snapshot: HardwareSnapshot,
        *,
        switch_links: int = 0,
        init_error: int | None = None,
        name_gi_profiles: bool = True,
        register_errors: dict[int, int] | None = None,
        faults: dict[tuple[str, int], int] | None = None,
        mig_profiles: tuple[MigProfileSpec, ...] = (),
        mig_instances: Mapping[str, tuple[GpuInstance, ...]] | None = None,
    ) -> None:
        self.snap = snapshot
        self.switch_links = switch_links
        self.init_error = init_error
        self.name_gi_profiles = name_gi_profiles
        self.register_errors = register_errors or {}
        self.faults = faults or {}
        self.devs = [Dev(g) for g in snapshot.gpus]
        self.migs = {m.uuid: Dev(g, m) for g in snapshot.gpus for m in g.mig_devices}
        profiles = sorted({_gi_profile(m) for g in snapshot.gpus for m in g.mig_devices})
        self.gi_profiles = {name: 100 + i for i, name in enumerate(profiles)}
        self.mig_profiles = mig_profiles
        self.mig_instances = mig_instances or {}
        if mig_profiles:
            self.gi_profiles = {p.name: p.gi_profile_id for p in mig_profiles}
        self.lost: set[str] = set()
        self.inits = self.shutdowns = 0
        self.event_sets: list[EventSet] = []
        self._cond = threading.Condition()
        # Device UUID -> pid -> (used MiB, SM %, kind: "compute", "mps" or "graphics").
        self.running: dict[str, dict[int, tuple[int, int, str]]] = {
            g.uuid: {p.pid: (p.used_mib, 0, "compute") for p in g.processes} for g in snapshot.gpus
        }
        self.util_calls: list[tuple[str, int]] = []  # (device UUID, lastSeenTimeStamp)
        self._clock_us = 1_000_000

    # --- test controls --------------------------------------------------------

    def fire(
        self,
        index: int,
        event_type: int,
        data: int = 0,
        gi: int = NO_INSTANCE,
        ci: int = NO_INSTANCE,
    ) -> None:
        dev = self.devs[index]
        with self._cond:
            for es in self.event_sets:
                if es.registered.get(dev.gpu.uuid, 0) & event_type:
                    es.queue.append(
                        SimpleNamespace(
                            device=dev,
                            eventType=event_type,
                            eventData=data,
                            gpuInstanceId=gi,
                            computeInstanceId=ci,
                        )
                    )
            self._cond.notify_all()

    def run(
        self, device_uuid: str, pid: int, used_mib: int, sm: int = 0, kind: str = "compute"
    ) -> None:
        """A process starts (or changes) on a GPU or MIG device."""
        self.running.setdefault(device_uuid, {})[pid] = (used_mib, sm, kind)

    def exit(self, pid: int) -> None:
        for procs in self.running.values():
            procs.pop(pid, None)

    def lose(self, index: int) -> None:
        with self._cond:
            self.lost.add(self.devs[index].gpu.uuid)
            self._cond.notify_all()

    # --- session and system ---------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise fail(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.snap.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        return self.snap.nvml_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.snap.cuda_driver_version

    # --- devices --------------------------------------------------------------

    def _fault(self, call: str, index: int) -> None:
        code = self.faults.get((call, index))
        if code is not None:
            raise fail(code)

    def _live(self, dev: Dev) -> Dev:
        if dev.gpu.uuid in self.lost:
            raise fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return dev

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devs)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Dev:
        self._fault("nvmlDeviceGetHandleByIndex", index)
        return self.devs[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Dev:
        found = next((d for d in self.devs if d.gpu.uuid == uuid), None) or self.migs.get(uuid)
        if found is None:
            raise fail(pynvml.NVML_ERROR_NOT_FOUND)
        self._fault("nvmlDeviceGetHandleByUUID", found.gpu.index)
        return self._live(found)

    def nvmlDeviceGetUUID(self, dev: Dev) -> str:
        self._fault("nvmlDeviceGetUUID", dev.gpu.index)
        return dev.mig.uuid if dev.mig else dev.gpu.uuid

    def nvmlDeviceGetName(self, dev: Dev) -> bytes:
        self._fault("nvmlDeviceGetName", dev.gpu.index)
        return dev.gpu.name.encode()

    def nvmlDeviceGetMinorNumber(self, dev: Dev) -> int:
        self._fault("nvmlDeviceGetMinorNumber", dev.gpu.index)
        return dev.gpu.minor

    def nvmlDeviceGetMemoryInfo(self, dev: Dev) -> SimpleNamespace:
        self._live(dev)
        self._fault("nvmlDeviceGetMemoryInfo", dev.gpu.index)
        mib = dev.mig.memory_mib if dev.mig else dev.gpu.memory_mib
        uuids = (
            [dev.mig.uuid] if dev.mig else [dev.gpu.uuid, *(m.uuid for m in dev.gpu.mig_devices)]
        )
        used = sum(m for u in uuids for m, _, _ in self.running.get(u, {}).values()) * MIB
        return SimpleNamespace(total=mib * MIB, used=used, free=mib * MIB - used)

    def nvmlDeviceGetCudaComputeCapability(self, dev: Dev) -> tuple[int, int]:
        self._fault("nvmlDeviceGetCudaComputeCapability", dev.gpu.index)
        return dev.gpu.compute_capability

    def nvmlDeviceGetPciInfo(self, dev: Dev) -> SimpleNamespace:
        self._fault("nvmlDeviceGetPciInfo", dev.gpu.index)
        return SimpleNamespace(
            busId=dev.gpu.pci_bus_id.encode(),
            pciDeviceId=dev.gpu.pci_device_id,
            pciSubSystemId=dev.gpu.pci_subsystem_id,
        )

    def nvmlDeviceGetBrand(self, dev: Dev) -> int:
        return _BRANDS[dev.gpu.brand]

    def nvmlDeviceGetArchitecture(self, dev: Dev) -> int:
        return _ARCHS[dev.gpu.architecture]

    def nvmlDeviceGetAttributes(self, dev: Dev) -> SimpleNamespace:
        if dev.mig is None:
            return SimpleNamespace(multiprocessorCount=dev.gpu.multiprocessors)
        compute, slices = _slices(dev.mig.profile)
        return SimpleNamespace(
            multiprocessorCount=dev.mig.multiprocessors,
            gpuInstanceSliceCount=slices,
            computeInstanceSliceCount=compute,
            memorySizeMB=dev.mig.memory_mib,
            sharedCopyEngineCount=dev.mig.engines.copy,
            sharedDecoderCount=dev.mig.engines.decoder,
            sharedEncoderCount=dev.mig.engines.encoder,
            sharedJpegCount=dev.mig.engines.jpeg,
            sharedOfaCount=dev.mig.engines.ofa,
        )

    def _procs(self, dev: Dev, kind: str, call: str) -> list[SimpleNamespace]:
        self._live(dev)
        self._fault(call, dev.gpu.index)
        uuid = dev.mig.uuid if dev.mig else dev.gpu.uuid
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=mib * MIB)
            for pid, (mib, _, k) in self.running.get(uuid, {}).items()
            if k == kind
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, dev: Dev) -> list[SimpleNamespace]:
        return self._procs(dev, "compute", "nvmlDeviceGetComputeRunningProcesses")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, dev: Dev) -> list[SimpleNamespace]:
        return self._procs(dev, "mps", "nvmlDeviceGetMPSComputeRunningProcesses")

    def nvmlDeviceGetGraphicsRunningProcesses(self, dev: Dev) -> list[SimpleNamespace]:
        return self._procs(dev, "graphics", "nvmlDeviceGetGraphicsRunningProcesses")

    def nvmlDeviceGetProcessUtilization(self, dev: Dev, last_seen: int) -> list[SimpleNamespace]:
        """As NVML: NotSupported on MIG, NotFound when no process used the GPU since."""
        self._fault("nvmlDeviceGetProcessUtilization", dev.gpu.index)
        if dev.gpu.mig_enabled:
            raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.util_calls.append((dev.gpu.uuid, last_seen))
        self._clock_us += 1
        busy = [
            SimpleNamespace(pid=pid, timeStamp=self._clock_us, smUtil=sm, memUtil=0)
            for pid, (_, sm, _) in self.running.get(dev.gpu.uuid, {}).items()
            if sm > 0
        ]
        if not busy:
            raise fail(pynvml.NVML_ERROR_NOT_FOUND)
        return busy

    def nvmlDeviceGetUtilizationRates(self, dev: Dev) -> SimpleNamespace:
        if dev.mig is not None or dev.gpu.mig_enabled:
            raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sm = sum(s for _, s, _ in self.running.get(dev.gpu.uuid, {}).values())
        return SimpleNamespace(gpu=min(100, sm), memory=0)

    # --- MIG ------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, dev: Dev) -> list[int]:
        self._fault("nvmlDeviceGetMigMode", dev.gpu.index)
        if not dev.gpu.mig_capable:
            raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = int(dev.gpu.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, dev: Dev) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, dev: Dev, index: int) -> Dev:
        self._fault("nvmlDeviceGetMigDeviceHandleByIndex", dev.gpu.index)
        if index >= len(dev.gpu.mig_devices):
            raise fail(pynvml.NVML_ERROR_NOT_FOUND)
        return self.migs[dev.gpu.mig_devices[index].uuid]

    def nvmlDeviceGetGpuInstanceId(self, dev: Dev) -> int:
        assert dev.mig is not None
        return dev.mig.gi

    def nvmlDeviceGetComputeInstanceId(self, dev: Dev) -> int:
        assert dev.mig is not None
        return dev.mig.ci

    def nvmlDeviceGetGpuInstanceProfileInfo(self, dev: Dev, index: int) -> SimpleNamespace:
        if not dev.gpu.mig_capable:
            raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.mig_profiles:
            if index >= len(self.mig_profiles):
                raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            p = self.mig_profiles[index]
            return SimpleNamespace(
                id=p.gi_profile_id,
                name=f"MIG {p.name}".encode(),
                sliceCount=p.slices,
                instanceCount=p.instance_count,
                multiprocessorCount=p.multiprocessors,
                memorySizeMB=p.memory_mib,
                copyEngineCount=p.engines.copy,
                decoderCount=p.engines.decoder,
                encoderCount=p.engines.encoder,
                jpegCount=p.engines.jpeg,
                ofaCount=p.engines.ofa,
            )
        for name, profile_id in self.gi_profiles.items():
            if profile_id - 100 == index:
                return SimpleNamespace(id=profile_id, name=f"MIG {name}".encode())
        raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _profile(self, profile_id: int) -> MigProfileSpec:
        found = next((p for p in self.mig_profiles if p.gi_profile_id == profile_id), None)
        if found is None:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return found

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self,
        dev: Dev,
        profile_id: int,
        out: ctypes.Array,
        count: object,  # type: ignore[type-arg]
    ) -> int:
        """As the C call: fills `out` and sets the count it is given by reference."""
        self._fault("nvmlDeviceGetGpuInstancePossiblePlacements", dev.gpu.index)
        placements = self._profile(profile_id).placements
        for i, p in enumerate(placements):
            out[i] = pynvml.c_nvmlGpuInstancePlacement_t(p.start, p.size)
        count._obj.value = len(placements)  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstances(
        self,
        dev: Dev,
        profile_id: int,
        out: ctypes.Array,
        count: object,  # type: ignore[type-arg]
    ) -> int:
        name = self._profile(profile_id).name
        held = [i for i in self.mig_instances.get(dev.gpu.uuid, ()) if i.profile.endswith(name)]
        by_gi = {i.gi: i for i in held}  # one handle per GPU instance
        for n, instance in enumerate(by_gi.values()):
            out[n] = instance
        count._obj.value = len(by_gi)  # type: ignore[attr-defined]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, dev: Dev, gi: int) -> MigDevice:
        if not self.name_gi_profiles:
            raise fail(pynvml.NVML_ERROR_NO_PERMISSION)
        return next(m for m in dev.gpu.mig_devices if m.gi == gi)

    def nvmlGpuInstanceGetInfo(self, instance: MigDevice | GpuInstance) -> SimpleNamespace:
        if isinstance(instance, MigDevice):
            return SimpleNamespace(profileId=self.gi_profiles[_gi_profile(instance)])
        start, size = instance.placement.start, instance.placement.size
        return SimpleNamespace(
            id=instance.gi,
            profileId=self.gi_profiles[split_profile(instance.profile)[0]],
            placement=SimpleNamespace(start=start, size=size),
        )

    # --- NVLink ---------------------------------------------------------------

    def _remotes(self, dev: Dev) -> list[str]:
        if not dev.gpu.nvlinks:
            return []
        if self.switch_links:
            return [
                f"00000000:{0xA0 + link % SWITCHES:02X}:00.0" for link in range(self.switch_links)
            ]
        by_uuid = {d.gpu.uuid: d.gpu for d in self.devs}
        return [by_uuid[peer].pci_bus_id for peer, count in dev.gpu.nvlinks for _ in range(count)]

    def nvmlDeviceGetNvLinkState(self, dev: Dev, link: int) -> int:
        remotes = self._remotes(dev)
        if not remotes:
            raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(remotes):
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, dev: Dev, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._remotes(dev)[link].lower().encode())

    # --- events ---------------------------------------------------------------

    def nvmlEventSetCreate(self) -> EventSet:
        self.event_sets.append(EventSet())
        return self.event_sets[-1]

    def nvmlDeviceGetSupportedEventTypes(self, dev: Dev) -> int:
        error = self.register_errors.get(dev.gpu.index)
        if error is not None:
            raise fail(error)
        supported: int = (
            pynvml.nvmlEventTypeXidCriticalError
            | pynvml.nvmlEventTypeDoubleBitEccError
            | pynvml.nvmlEventTypeSingleBitEccError
            | pynvml.nvmlEventTypePState
        )
        return supported

    def nvmlDeviceRegisterEvents(self, dev: Dev, types: int, es: EventSet) -> None:
        self._fault("nvmlDeviceRegisterEvents", dev.gpu.index)
        es.registered[dev.gpu.uuid] = types

    def nvmlEventSetWait_v2(self, es: EventSet, timeout_ms: int) -> SimpleNamespace:
        with self._cond:
            self._cond.wait_for(
                lambda: es.queue or self._lost_watched(es), timeout=timeout_ms / 1000
            )
            if es.queue:
                return es.queue.pop(0)
            if self._lost_watched(es):
                raise fail(pynvml.NVML_ERROR_GPU_IS_LOST)
            raise fail(pynvml.NVML_ERROR_TIMEOUT)

    def _lost_watched(self, es: EventSet) -> bool:
        return bool(self.lost & es.registered.keys())

    def nvmlEventSetFree(self, es: EventSet) -> None:
        es.freed = True


def _slices(profile: str) -> tuple[int, int]:
    """(compute slices, GPU slices) of "3g.20gb" or "1c.3g.20gb"."""
    parts = profile.split(".")
    slices = int(next(p for p in parts if p.endswith("g"))[:-1])
    compute = int(parts[0][:-1]) if parts[0].endswith("c") else slices
    return compute, slices


def _gi_profile(mig: MigDevice) -> str:
    return mig.profile.split(".", 1)[1] if mig.profile.split(".")[0].endswith("c") else mig.profile


def host_tree(snapshot: HardwareSnapshot, root: Path) -> tuple[Path, Path]:
    """Write the /sys and /proc files NvmlBackend reads for this snapshot."""
    sys_root, proc_root = root / "sys", root / "proc"
    dmi = sys_root / "class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "product_name").write_text(snapshot.machine + "\n")
    lines = ["config 1", "monitor 2"]
    for gpu in snapshot.gpus:
        domain, rest = gpu.pci_bus_id.split(":", 1)
        name = f"{int(domain, 16):04x}:{rest.lower()}"
        device = sys_root / "bus/pci/devices" / name
        if gpu.pcie_root:  # as sysfs has it: a link into the device tree under its root
            (sys_root / "devices" / gpu.pcie_root / name).mkdir(parents=True)
            device.parent.mkdir(parents=True, exist_ok=True)
            device.symlink_to(f"../../../devices/{gpu.pcie_root}/{name}")
        else:
            device.mkdir(parents=True)
        numa = -1 if gpu.numa_node is None else gpu.numa_node
        (device / "numa_node").write_text(f"{numa}\n")
        for mig in gpu.mig_devices:
            gi_cap, ci_cap = (int(p.rsplit("nvidia-cap", 1)[1]) for p in mig.cap_paths)
            lines.append(f"gpu{gpu.minor}/gi{mig.gi}/access {gi_cap}")
            lines.append(f"gpu{gpu.minor}/gi{mig.gi}/ci{mig.ci}/access {ci_cap}")
    caps = proc_root / "driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("\n".join(lines) + "\n")
    return sys_root, proc_root


def open_backend(fake: FakeNvml, root: Path) -> NvmlBackend:
    sys_root, proc_root = host_tree(fake.snap, root)
    return NvmlBackend.open(lib=fake, sys_root=sys_root, proc_root=proc_root)
