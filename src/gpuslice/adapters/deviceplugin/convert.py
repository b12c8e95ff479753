"""Core values <-> device-plugin protobuf messages."""

from __future__ import annotations

from collections.abc import Iterable

from gpuslice.adapters.deviceplugin.api import HEALTHY, UNHEALTHY, pb
from gpuslice.core.resources import AdvertisedDevice
from gpuslice.core.response import ContainerAllocation, DeviceSpec, Mount


def device_list(devices: Iterable[tuple[AdvertisedDevice, bool]]) -> pb.ListAndWatchResponse:
    """The full ListAndWatch message: ID, health and the NUMA node when known."""
    return pb.ListAndWatchResponse(
        devices=[
            pb.Device(
                ID=dev.id,
                health=HEALTHY if healthy else UNHEALTHY,
                topology=(
                    None
                    if dev.numa_node is None
                    else pb.TopologyInfo(nodes=[pb.NUMANode(ID=dev.numa_node)])
                ),
            )
            for dev, healthy in devices
        ]
    )


def allocation_to_pb(alloc: ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=alloc.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in alloc.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in alloc.device_specs
        ],
        annotations=alloc.annotations,
        cdi_devices=[pb.CDIDevice(name=name) for name in alloc.cdi_devices],
    )


def allocation_from_pb(msg: pb.ContainerAllocateResponse) -> ContainerAllocation:
    """What a container runtime would receive, back as a core value."""
    return ContainerAllocation(
        envs=dict(msg.envs),
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in msg.mounts),
        device_specs=tuple(
            DeviceSpec(d.container_path, d.host_path, d.permissions) for d in msg.devices
        ),
        annotations=dict(msg.annotations),
        cdi_devices=tuple(c.name for c in msg.cdi_devices),
    )
