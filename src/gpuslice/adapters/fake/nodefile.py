"""The YAML node file (and built-in profile) format -> a HardwareSnapshot.

Every value is checked; a mistake raises ConfigError with one line naming the
source, the field path and what is allowed. Omitted identities (UUIDs, minors,
PCI bus IDs, MIG capability minors) are derived deterministically from the
node name and GPU index, so the same file always yields the same snapshot.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from gpuslice.adapters.fake.fields import Fields, describe
from gpuslice.adapters.fake.layout import apply_nvlinks, check_unique
from gpuslice.adapters.fake.models import MODELS, GpuModel, mig_device_size
from gpuslice.config.yaml_text import YAMLError, load_yaml
from gpuslice.core.devices import Gpu, GpuProcess, HardwareSnapshot, MigDevice, MigEngines
from gpuslice.core.errors import ConfigError

NODE_KEYS = ("name", "machine", "driver_version", "nvml_version", "cuda_driver_version")
TOP_KEYS = (*NODE_KEYS, "gpus", "nvlink", "imex_channels", "cgroup")
CGROUP_KEYS = ("version", "dmem")
GPU_KEYS = (
    "model", "count", "name", "uuid", "minor", "memory_mib", "compute_capability",
    "pci_bus_id", "numa_node", "pcie_root", "brand", "architecture", "multiprocessors",
    "mig_capable", "mig_enabled", "mig_devices", "processes",
)  # fmt: skip
PER_GPU_KEYS = ("uuid", "minor", "pci_bus_id")
MIG_KEYS = ("profile", "gi", "ci", "uuid", "memory_mib", "multiprocessors", "cap_paths")
PROCESS_KEYS = ("pid", "used_mib")

_NAMESPACE = uuid.UUID("5b0c7d4e-2a61-4f0e-9d3c-6f1e8a2b4c70")
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
GPU_UUID = re.compile(rf"GPU-{_UUID}")
MIG_UUID = re.compile(rf"MIG-{_UUID}")
MIG_PROFILE = re.compile(r"(?:(\d+)c\.)?(\d+)g\.\d+gb(?:\+[a-z]+)*")
PCI_BUS_ID = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")
COMPUTE_CAPABILITY = re.compile(r"(\d+)\.(\d+)")
# /proc/driver/nvidia-caps/mig-minors numbering: "config" 1, "monitor" 2, then per
# GPU minor 15 GPU instances, each one access minor followed by 8 CI access minors.
CAPS_PER_GI, GIS_PER_GPU = 9, 15


def derived_uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuid.uuid5(_NAMESPACE, '/'.join(map(str, parts)))}"


def mig_cap_paths(gpu_minor: int, gi: int, ci: int) -> tuple[str, str]:
    gi_minor = 3 + gpu_minor * CAPS_PER_GI * GIS_PER_GPU + gi * CAPS_PER_GI
    return (
        f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1 + ci}",
    )


@dataclass(frozen=True, slots=True)
class SimulatedCgroup:
    """The simulated node's cgroup tree, as `gpuslice inspect` and memory isolation see
    it: by default cgroup v2 with the dmem controller over every GPU (a current node)."""

    version: int = 2
    dmem: bool = True


@dataclass(frozen=True, slots=True)
class NodeFile:
    """A node description: its GPUs, the IMEX channels whose device nodes exist and its
    cgroup tree's facts."""

    snapshot: HardwareSnapshot
    imex_channels: frozenset[int] = frozenset()
    cgroup: SimulatedCgroup = SimulatedCgroup()


def parse_node(text: str, source: str) -> HardwareSnapshot:
    """Parse and validate a node description; `source` prefixes every error."""
    return parse_node_file(text, source).snapshot


def parse_node_file(text: str, source: str) -> NodeFile:
    """parse_node, with the node's IMEX channels."""
    try:
        data = load_yaml(text)  # bounded as config text is
    except (YAMLError, RecursionError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "unreadable"
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}") from None
    top = Fields(data, "", source, TOP_KEYS)
    name = top.text("name", "the node name, which seeds derived UUIDs")
    gpus: list[Gpu] = []
    for path, raw in top.items("gpus", required=True):
        gpus.extend(_gpu_entry(Fields(raw, path, source, GPU_KEYS), name, len(gpus)))
    check_unique(top, gpus)
    gpus = apply_nvlinks(top, gpus)
    snapshot = HardwareSnapshot(
        gpus=tuple(gpus),
        driver_version=top.opt_text("driver_version") or "",
        nvml_version=top.opt_text("nvml_version") or "",
        cuda_driver_version=top.opt_integer("cuda_driver_version") or 0,
        machine=top.opt_text("machine") or "",
        extra={"backend": "fake", "node": name},
    )
    return NodeFile(snapshot, _imex_channels(top), _cgroup(top))


def _cgroup(top: Fields) -> SimulatedCgroup:
    f = top.section("cgroup", CGROUP_KEYS)
    if f is None:
        return SimulatedCgroup()
    version = f.opt_integer("version", minimum=1) or 2
    if version not in (1, 2):
        f.fail(f.at("version"), f"expected 1 or 2, got {version}")
    dmem = f.flag("dmem", version == 2)
    if dmem and version == 1:
        f.fail(f.at("dmem"), "the dmem controller needs cgroup v2 (version: 2)")
    return SimulatedCgroup(version, dmem)


def _imex_channels(top: Fields) -> frozenset[int]:
    channels: set[int] = set()
    for path, raw in top.items("imex_channels"):
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0 or raw in channels:
            top.fail(path, f"expected a distinct channel number >= 0, got {describe(raw)}")
        channels.add(raw)
    return frozenset(channels)


@dataclass(frozen=True, slots=True)
class _Base:
    """What a GPU entry says before per-GPU identities are filled in."""

    name: str
    memory_mib: int
    compute_capability: tuple[int, int]
    multiprocessors: int
    architecture: str
    brand: str
    mig_capable: bool
    pci_device_id: int


def _gpu_entry(f: Fields, node: str, first_index: int) -> list[Gpu]:
    count = f.opt_integer("count", minimum=1) or 1
    if count > 1:
        for key in PER_GPU_KEYS:
            if f.has(key):
                f.fail(f.at(key), "not allowed with count > 1 (each GPU needs its own)")
    model = _model(f)
    base = _base(f, model)
    mig_enabled = f.flag("mig_enabled", False)
    if mig_enabled and not base.mig_capable:
        f.fail(f.at("mig_enabled"), "true needs a MIG-capable GPU (set mig_capable: true)")
    if f.has("mig_devices") and not mig_enabled:
        f.fail(f.at("mig_devices"), "given but mig_enabled is false")
    processes = tuple(
        _process(Fields(raw, p, f.source, PROCESS_KEYS)) for p, raw in f.items("processes")
    )
    gpus = []
    for index in range(first_index, first_index + count):
        gpu_uuid = f.opt_text("uuid", "a GPU UUID") or derived_uuid("GPU", node, index)
        if not GPU_UUID.fullmatch(gpu_uuid):
            f.fail(
                f.at("uuid"), f"expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got {gpu_uuid!r}"
            )
        minor = f.opt_integer("minor")
        minor = index if minor is None else minor
        migs = tuple(
            _mig(Fields(raw, p, f.source, MIG_KEYS), i, model, gpu_uuid, minor)
            for i, (p, raw) in enumerate(f.items("mig_devices"))
        )
        gpus.append(
            Gpu(
                index=index,
                uuid=gpu_uuid,
                name=base.name,
                minor=minor,
                memory_mib=base.memory_mib,
                compute_capability=base.compute_capability,
                pci_bus_id=_pci_bus_id(f, index),
                numa_node=f.opt_integer("numa_node"),
                pcie_root=f.opt_text("pcie_root") or "",
                brand=base.brand,
                architecture=base.architecture,
                multiprocessors=base.multiprocessors,
                mig_capable=base.mig_capable,
                pci_device_id=base.pci_device_id,
                mig_enabled=mig_enabled,
                mig_devices=migs,
                processes=processes,
            )
        )
    return gpus


def _model(f: Fields) -> GpuModel | None:
    key = f.opt_text("model", "a model name")
    if key is None:
        return None
    if key not in MODELS:
        f.fail(f.at("model"), f"unknown model {key!r} (known: {', '.join(MODELS)})")
    return MODELS[key]


def _base(f: Fields, model: GpuModel | None) -> _Base:
    def need(key: str) -> None:
        if model is None and not f.has(key):
            f.fail(f.at(key), "missing (give it, or name a model)")

    for key in ("name", "memory_mib", "compute_capability"):
        need(key)
    cc_text = f.opt_text("compute_capability", 'a string "major.minor" (quote it)')
    if cc_text is not None:
        match = COMPUTE_CAPABILITY.fullmatch(cc_text)
        if match is None:
            f.fail(f.at("compute_capability"), f'expected "major.minor", got {cc_text!r}')
        cc = (int(match[1]), int(match[2]))
    else:
        assert model is not None
        cc = model.compute_capability
    memory = f.opt_integer("memory_mib", minimum=1)
    return _Base(
        name=f.opt_text("name") or (model.name if model else ""),
        memory_mib=memory if memory is not None else (model.memory_mib if model else 0),
        compute_capability=cc,
        multiprocessors=f.opt_integer("multiprocessors") or (model.multiprocessors if model else 0),
        architecture=f.opt_text("architecture") or (model.architecture if model else ""),
        brand=f.opt_text("brand") or (model.brand if model else "NVIDIA"),
        mig_capable=f.flag("mig_capable", model.mig_capable if model else False),
        pci_device_id=model.pci_device_id if model else 0,
    )


def _pci_bus_id(f: Fields, index: int) -> str:
    given = f.opt_text("pci_bus_id", 'a PCI bus ID like "00000000:07:00.0"')
    if given is None:
        return f"{(index + 1) // 256:08X}:{(index + 1) % 256:02X}:00.0"
    if not PCI_BUS_ID.fullmatch(given.upper()):
        f.fail(f.at("pci_bus_id"), f'expected "DDDDDDDD:BB:DD.F" (hex), got {given!r}')
    return given.upper()


def _mig(f: Fields, index: int, model: GpuModel | None, gpu_uuid: str, minor: int) -> MigDevice:
    profile = f.text("profile", 'a MIG profile such as "1g.5gb"')
    match = MIG_PROFILE.fullmatch(profile)
    if match is None:
        f.fail(f.at("profile"), f'expected "<g>g.<m>gb" or "<c>c.<g>g.<m>gb", got {profile!r}')
    gi, ci = f.integer("gi"), f.opt_integer("ci") or 0
    known = mig_device_size(model, profile)
    memory = f.opt_integer("memory_mib", minimum=1)
    if memory is None:
        if known is None:
            f.fail(f.at("memory_mib"), f"missing (no built-in size for {profile!r} on this model)")
        memory = known.memory_mib
    slices, compute = int(match[2]), int(match[1] or match[2])
    sms = f.opt_integer("multiprocessors")
    if sms is None and known is not None:
        sms = known.multiprocessors
    mig_uuid = f.opt_text("uuid", "a MIG UUID") or derived_uuid("MIG", gpu_uuid, gi, ci)
    if not MIG_UUID.fullmatch(mig_uuid):
        f.fail(f.at("uuid"), f"expected MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got {mig_uuid!r}")
    caps = [_cap_path(p, raw, f) for p, raw in f.items("cap_paths")]
    return MigDevice(
        uuid=mig_uuid,
        index=index,
        profile=profile,
        gi=gi,
        ci=ci,
        memory_mib=memory,
        multiprocessors=sms or 0,
        cap_paths=tuple(caps) if f.has("cap_paths") else mig_cap_paths(minor, gi, ci),
        gi_slices=slices,
        ci_slices=compute,
        engines=known.engines if known is not None else MigEngines(),
    )


def _cap_path(path: str, raw: object, f: Fields) -> str:
    if not isinstance(raw, str) or not raw.startswith("/dev/"):
        f.fail(path, f"expected a /dev path, got {describe(raw)}")
    return raw


def _process(f: Fields) -> GpuProcess:
    return GpuProcess(pid=f.integer("pid", minimum=1), used_mib=f.integer("used_mib"))
