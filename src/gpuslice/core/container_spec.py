"""One container's allocated devices -> what its runtime gets (env, mounts,
device nodes, CDI names), following the selected device-list strategies."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from gpuslice.core.resources import AdvertisedDevice, Resource
from gpuslice.core.response import (
    CDI_ANNOTATIONS,
    CDI_CRI,
    ENVVAR,
    ID_INDEX,
    VOLUME_MOUNTS,
    AllocateOptions,
    ContainerAllocation,
    DeviceSpec,
    Mount,
)

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DEVICE_LIST_ROOT = "/var/run/nvidia-container-devices"
CDI_VENDOR = "k8s.device-plugin.nvidia.com"
IMEX_CHANNEL_DEV = "/dev/nvidia-caps-imex-channels/channel{}"
IMEX_CHANNELS = (0,)  # the channels a config may ask for (imex.channelIDs: [] or [0])
# Driver control nodes handed out with passDeviceSpecs when they exist on the node.
CONTROL_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)


def visible_ids(devices: Sequence[AdvertisedDevice], id_strategy: str) -> list[str]:
    """Physical IDs (or indexes) with replicas of one device collapsed to one."""
    ids = (d.index if id_strategy == ID_INDEX else d.physical_id for d in devices)
    return list(dict.fromkeys(ids))


def container_allocation(
    resource: Resource,
    devices: Sequence[AdvertisedDevice],
    opts: AllocateOptions,
    *,
    token: str,
    control_devices: Sequence[str] = (),
) -> ContainerAllocation:
    """`token` makes the CDI annotation key unique per response; `control_devices`
    are the CONTROL_DEVICES present on this node."""
    visible = visible_ids(devices, opts.id_strategy)
    strategies = set(opts.list_strategies)
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    annotations: dict[str, str] = {}
    cdi: list[str] = []
    if strategies & {CDI_ANNOTATIONS, CDI_CRI}:
        names = [f"{opts.cdi_kind}={v}" for v in visible]
        toolkit = (opts.toolkit_cdi.name_for(d.physical_id, d.index) for d in devices)
        names += dict.fromkeys(n for n in toolkit if n is not None)
        names += [f"{CDI_VENDOR}/imex-channel={c}" for c in opts.imex_channel_ids]
        names += [f"{CDI_VENDOR}/{x}=all" for x in _extras(opts)]
        if CDI_ANNOTATIONS in strategies:
            key = f"{opts.cdi_annotation_prefix}nvidia-device-plugin_{token}"
            annotations[key] = ",".join(names)
        if CDI_CRI in strategies:
            cdi = names
    resource.serving.add_container_edits(resource.name, opts.mps_root, envs, mounts)
    for extra in _extras(opts):
        envs[f"NVIDIA_{extra.upper()}"] = "enabled"
    specs: tuple[DeviceSpec, ...] = ()
    # As upstream: with only CDI strategies the runtime injects the devices.
    if strategies & {ENVVAR, VOLUME_MOUNTS}:
        _visible_devices(envs, mounts, visible, strategies, opts)
        if opts.pass_device_specs:
            specs = _device_specs(devices, opts, control_devices)
    return ContainerAllocation(
        envs=envs,
        mounts=tuple(mounts),
        device_specs=specs,
        annotations=annotations,
        cdi_devices=tuple(cdi),
    )


def _extras(opts: AllocateOptions) -> list[str]:
    flags = (("gdrcopy", opts.gdrcopy_enabled), ("gds", opts.gds_enabled))
    return [name for name, on in (*flags, ("mofed", opts.mofed_enabled)) if on]


def _visible_devices(
    envs: dict[str, str],
    mounts: list[Mount],
    visible: list[str],
    strategies: set[str],
    opts: AllocateOptions,
) -> None:
    channels = [str(c) for c in opts.imex_channel_ids]
    if ENVVAR in strategies:
        envs[VISIBLE_DEVICES] = ",".join(visible)
        if channels:
            envs["NVIDIA_IMEX_CHANNELS"] = ",".join(channels)
    if VOLUME_MOUNTS in strategies:
        # As upstream: with both strategies the volume-mount value wins.
        envs[VISIBLE_DEVICES] = DEVICE_LIST_ROOT
        mounts += [Mount(f"{DEVICE_LIST_ROOT}/{v}", "/dev/null") for v in visible]
        mounts += [Mount(f"{DEVICE_LIST_ROOT}/imex/{c}", "/dev/null") for c in channels]


def _device_specs(
    devices: Sequence[AdvertisedDevice], opts: AllocateOptions, control_devices: Sequence[str]
) -> tuple[DeviceSpec, ...]:
    paths = [p for p in CONTROL_DEVICES if p in control_devices]
    paths += [p for d in devices for p in d.paths]
    paths += [IMEX_CHANNEL_DEV.format(c) for c in opts.imex_channel_ids]
    return tuple(
        DeviceSpec(container_path=p, host_path=posixpath.join(opts.dev_root, p.lstrip("/")))
        for p in dict.fromkeys(paths)
    )
