"""The container-side answer to Allocate, as plain data (no protobuf)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.core.cdi_toolkit import ToolkitDevices

ENVVAR = "envvar"
VOLUME_MOUNTS = "volume-mounts"
CDI_ANNOTATIONS = "cdi-annotations"
CDI_CRI = "cdi-cri"
LIST_STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI)

ID_UUID = "uuid"
ID_INDEX = "index"

DISTRIBUTED = "distributed"
PACKED = "packed"


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    device_specs: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocateOptions:
    """The flags that shape Allocate responses and preferred allocations."""

    list_strategies: tuple[str, ...] = (ENVVAR,)
    id_strategy: str = ID_UUID
    pass_device_specs: bool = False
    dev_root: str = "/"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    cdi_kind: str = "k8s.device-plugin.nvidia.com/gpu"
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    mps_root: str = ""
    imex_channel_ids: tuple[int, ...] = ()
    # The NVIDIA Container Toolkit's CDI devices, named beside ours under cdi-* (found
    # on the node where the agent serves; never from the config).
    toolkit_cdi: ToolkitDevices = field(default_factory=ToolkitDevices)
    allocation_policy: str = DISTRIBUTED
