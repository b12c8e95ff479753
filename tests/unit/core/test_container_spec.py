"""container_allocation: what one container's runtime gets per strategy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gpuslice.config.convert import usable_imex_channels
from gpuslice.core.container_spec import (
    CONTROL_DEVICES,
    DEVICE_LIST_ROOT,
    VISIBLE_DEVICES,
    container_allocation,
)
from gpuslice.core.devices import replica_id
from gpuslice.core.errors import HardwareError
from gpuslice.core.resources import AdvertisedDevice, Resource, build_resources
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
from gpuslice.core.sharing import MIG_MIXED, MIG_NONE, MPS, ReplicaRule

from . import builders as b

TOKEN = "0f1e2d3c"
CDI_KEY = f"cdi.k8s.io/nvidia-device-plugin_{TOKEN}"
GPU0, GPU1, GPU2 = (b.gpu_uuid(i) for i in range(3))


def shared(strategy: str = "time-slicing", *, count: int = 3) -> Resource:
    return b.replicated_gpus(count, 2, strategy=strategy)


def whole(count: int = 3) -> Resource:
    return b.only(build_resources(b.snapshot(*b.gpus(count)), b.settings()))


def mig_resource() -> Resource:
    snap = b.snapshot(b.gpu(0, profiles=["1g.5gb"] * 2), b.gpu(1, profiles=["1g.5gb"] * 3))
    return b.by_name(build_resources(snap, b.settings(MIG_MIXED)))["nvidia.com/mig-1g.5gb"]


def pick(resource: Resource, ids: Sequence[str]) -> list[AdvertisedDevice]:
    devices = [resource.device(i) for i in ids]
    assert all(d is not None for d in devices)
    return [d for d in devices if d is not None]


def allocate(
    resource: Resource, ids: Sequence[str], *, control: Sequence[str] = (), **opts: object
) -> ContainerAllocation:
    options = AllocateOptions(**opts)  # type: ignore[arg-type]
    return container_allocation(
        resource, pick(resource, ids), options, token=TOKEN, control_devices=control
    )


# --- envvar and device IDs ----------------------------------------------------


def test_envvar_collapses_replicas_of_one_gpu_and_keeps_order() -> None:
    ids = [replica_id(GPU1, 1), replica_id(GPU0, 0), replica_id(GPU1, 0)]
    got = allocate(shared(), ids)
    assert got.envs == {VISIBLE_DEVICES: f"{GPU1},{GPU0}"}
    assert (got.mounts, got.device_specs, got.annotations, got.cdi_devices) == ((), (), {}, ())


def test_index_strategy_uses_gpu_indexes_and_collapses_replicas() -> None:
    ids = [replica_id(GPU2, 0), replica_id(GPU0, 1), replica_id(GPU2, 1)]
    got = allocate(shared(), ids, id_strategy=ID_INDEX)
    assert got.envs[VISIBLE_DEVICES] == "2,0"


def test_index_strategy_names_mig_devices_gpu_colon_mig() -> None:
    res = mig_resource()
    ids = [b.mig_uuid(1, 2), b.mig_uuid(0, 0)]
    assert allocate(res, ids, id_strategy=ID_INDEX).envs[VISIBLE_DEVICES] == "1:2,0:0"
    assert allocate(res, ids).envs[VISIBLE_DEVICES] == ",".join(ids)


# --- volume mounts --------------------------------------------------------------


def test_volume_mounts_list_one_dev_null_mount_per_device() -> None:
    ids = [replica_id(GPU0, 0), replica_id(GPU0, 1), replica_id(GPU2, 0)]
    got = allocate(shared(), ids, list_strategies=(VOLUME_MOUNTS,))
    assert got.envs == {VISIBLE_DEVICES: DEVICE_LIST_ROOT}
    assert got.mounts == (
        Mount(f"{DEVICE_LIST_ROOT}/{GPU0}", "/dev/null"),
        Mount(f"{DEVICE_LIST_ROOT}/{GPU2}", "/dev/null"),
    )


@pytest.mark.parametrize("order", [(ENVVAR, VOLUME_MOUNTS), (VOLUME_MOUNTS, ENVVAR)])
def test_volume_mounts_value_wins_over_envvar(order: tuple[str, str]) -> None:
    got = allocate(whole(), [GPU1], list_strategies=order)
    assert got.envs == {VISIBLE_DEVICES: DEVICE_LIST_ROOT}
    assert got.mounts == (Mount(f"{DEVICE_LIST_ROOT}/{GPU1}", "/dev/null"),)


# --- CDI ------------------------------------------------------------------------


def test_cdi_annotations_one_key_with_comma_joined_names() -> None:
    got = allocate(
        shared(), [replica_id(GPU0, 1), replica_id(GPU1, 0)], list_strategies=(CDI_ANNOTATIONS,)
    )
    assert got.annotations == {
        CDI_KEY: f"k8s.device-plugin.nvidia.com/gpu={GPU0},k8s.device-plugin.nvidia.com/gpu={GPU1}"
    }
    assert got.cdi_devices == ()
    assert VISIBLE_DEVICES not in got.envs
    assert got.mounts == ()


def test_cdi_annotation_key_uses_the_configured_prefix() -> None:
    got = allocate(
        whole(),
        [GPU0],
        list_strategies=(CDI_ANNOTATIONS,),
        cdi_annotation_prefix="cdi.example.org/",
    )
    assert list(got.annotations) == [f"cdi.example.org/nvidia-device-plugin_{TOKEN}"]


def test_cdi_cri_fills_cdi_devices() -> None:
    got = allocate(whole(), [GPU2, GPU0], list_strategies=(CDI_CRI,))
    assert got.cdi_devices == (
        f"k8s.device-plugin.nvidia.com/gpu={GPU2}",
        f"k8s.device-plugin.nvidia.com/gpu={GPU0}",
    )
    assert got.annotations == {}
    assert got.envs == {}


def test_cdi_names_use_index_ids_under_the_index_strategy() -> None:
    got = allocate(
        mig_resource(), [b.mig_uuid(1, 0)], list_strategies=(CDI_CRI,), id_strategy=ID_INDEX
    )
    assert got.cdi_devices == ("k8s.device-plugin.nvidia.com/gpu=1:0",)


def test_only_cdi_strategies_skip_envvar_mounts_and_device_specs() -> None:
    """As upstream: when every strategy is CDI the runtime injects the devices,
    so no NVIDIA_VISIBLE_DEVICES and no DeviceSpecs are added."""
    got = allocate(
        whole(),
        [GPU0],
        control=CONTROL_DEVICES,
        list_strategies=(CDI_ANNOTATIONS, CDI_CRI),
        pass_device_specs=True,
        imex_channel_ids=(0,),
    )
    assert got.envs == {}
    assert got.mounts == ()
    assert got.device_specs == ()
    assert len(got.annotations) == 1
    assert len(got.cdi_devices) == 2  # the GPU and the IMEX channel


def test_cdi_with_envvar_adds_both() -> None:
    got = allocate(whole(), [GPU0], list_strategies=(CDI_CRI, ENVVAR))
    assert got.envs == {VISIBLE_DEVICES: GPU0}
    assert got.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={GPU0}",)


# --- passDeviceSpecs ----------------------------------------------------------------


def test_device_specs_add_present_control_devices_then_device_nodes() -> None:
    control = ("/dev/nvidia-uvm", "/dev/nvidiactl")
    ids = [replica_id(GPU1, 0), replica_id(GPU1, 1), replica_id(GPU0, 0)]
    got = allocate(shared(), ids, control=control, pass_device_specs=True)
    assert got.device_specs == tuple(
        DeviceSpec(p, p, "rw")
        for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidia0")
    )


def test_device_specs_without_control_devices_present() -> None:
    got = allocate(whole(), [GPU2], pass_device_specs=True)
    assert got.device_specs == (DeviceSpec("/dev/nvidia2", "/dev/nvidia2"),)


def test_device_specs_include_mig_capability_nodes_once_per_parent() -> None:
    ids = [b.mig_uuid(1, 0), b.mig_uuid(1, 2)]
    got = allocate(mig_resource(), ids, pass_device_specs=True)
    expected = ("/dev/nvidia1", *b.mig(1, 0).cap_paths, *b.mig(1, 2).cap_paths)
    assert [s.container_path for s in got.device_specs] == list(expected)


def test_device_spec_host_paths_sit_under_dev_root() -> None:
    got = allocate(
        whole(), [GPU0], control=("/dev/nvidiactl",), pass_device_specs=True, dev_root="/host"
    )
    assert got.device_specs == (
        DeviceSpec("/dev/nvidiactl", "/host/dev/nvidiactl"),
        DeviceSpec("/dev/nvidia0", "/host/dev/nvidia0"),
    )


def test_device_specs_are_not_passed_unless_asked() -> None:
    assert allocate(whole(), [GPU0], control=CONTROL_DEVICES).device_specs == ()


# --- extras and IMEX ------------------------------------------------------------------


EXTRAS: dict[str, Any] = {"gdrcopy_enabled": True, "gds_enabled": True, "mofed_enabled": True}


def test_extras_set_enabled_envs() -> None:
    got = allocate(whole(), [GPU0], **EXTRAS)
    assert got.envs == {
        VISIBLE_DEVICES: GPU0,
        "NVIDIA_GDRCOPY": "enabled",
        "NVIDIA_GDS": "enabled",
        "NVIDIA_MOFED": "enabled",
    }


def test_one_extra_alone() -> None:
    got = allocate(whole(), [GPU0], gds_enabled=True, list_strategies=(CDI_CRI,))
    assert got.envs == {"NVIDIA_GDS": "enabled"}
    assert got.cdi_devices[1:] == ("k8s.device-plugin.nvidia.com/gds=all",)


def test_extras_and_imex_become_cdi_names() -> None:
    got = allocate(whole(), [GPU0], list_strategies=(CDI_CRI,), imex_channel_ids=(0,), **EXTRAS)
    assert got.cdi_devices == (
        f"k8s.device-plugin.nvidia.com/gpu={GPU0}",
        "k8s.device-plugin.nvidia.com/imex-channel=0",
        "k8s.device-plugin.nvidia.com/gdrcopy=all",
        "k8s.device-plugin.nvidia.com/gds=all",
        "k8s.device-plugin.nvidia.com/mofed=all",
    )


def test_imex_channel_as_env_mount_and_device_spec() -> None:
    got = allocate(
        whole(),
        [GPU0],
        list_strategies=(ENVVAR, VOLUME_MOUNTS),
        imex_channel_ids=(0,),
        pass_device_specs=True,
    )
    assert got.envs["NVIDIA_IMEX_CHANNELS"] == "0"
    assert Mount(f"{DEVICE_LIST_ROOT}/imex/0", "/dev/null") in got.mounts
    channel = "/dev/nvidia-caps-imex-channels/channel0"
    assert got.device_specs[-1] == DeviceSpec(channel, channel)


def test_a_required_imex_channel_that_is_missing_fails_naming_its_device() -> None:
    """As upstream: with imex.required the plugin does not start without the channel."""
    with pytest.raises(HardwareError) as caught:
        usable_imex_channels((0,), frozenset(), required=True)
    assert str(caught.value) == (
        "imex.required: IMEX channel 0 is required but /dev/nvidia-caps-imex-channels/channel0 "
        "does not exist on this node; start the IMEX daemon that creates it, or set "
        "imex.required (--imex-required, IMEX_REQUIRED) to false"
    )


def test_a_missing_imex_channel_not_required_is_left_out_with_a_warning() -> None:
    """No NVIDIA_IMEX_CHANNELS=0 for a channel that does not exist (upstream skips it)."""
    channels, warnings = usable_imex_channels((0,), frozenset(), required=False)
    assert channels == ()
    assert warnings == (
        "imex.channelIDs: /dev/nvidia-caps-imex-channels/channel0 does not exist on this "
        "node; channel 0 is left out of every allocation (imex.required is false)",
    )


@pytest.mark.parametrize("required", [True, False])
def test_a_present_imex_channel_is_handed_out_silently(required: bool) -> None:
    assert usable_imex_channels((0,), {0}, required=required) == ((0,), ())
    assert usable_imex_channels((), set(), required=required) == ((), ())


def test_no_imex_env_without_channels() -> None:
    assert "NVIDIA_IMEX_CHANNELS" not in allocate(whole(), [GPU0]).envs


# --- MPS ------------------------------------------------------------------------------


MPS_PIPE = "/mps/nvidia.com/gpu/pipe"
MPS_LOG = "/mps/nvidia.com/gpu/log"
MPS_ENV = {"CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE, "CUDA_MPS_LOG_DIRECTORY": MPS_LOG}


def test_mps_resource_gets_its_daemons_dirs_and_a_private_shm() -> None:
    """Upstream's env and container paths; the host dirs are the resource's daemon's,
    and /dev/shm comes from <mpsRoot>/<resource>/shm, not one node-wide directory."""
    got = allocate(shared(MPS), [replica_id(GPU0, 0)], mps_root="/run/nvidia/mps")
    assert got.envs == {VISIBLE_DEVICES: GPU0, **MPS_ENV}
    assert got.mounts == (
        Mount(MPS_PIPE, "/run/nvidia/mps/nvidia.com/gpu/pipe"),
        Mount(MPS_LOG, "/run/nvidia/mps/nvidia.com/gpu/log"),
        Mount("/dev/shm", "/run/nvidia/mps/nvidia.com/gpu/shm"),
    )


def test_mps_mounts_stay_with_cdi_only_strategies() -> None:
    got = allocate(
        shared(MPS), [replica_id(GPU0, 0)], mps_root="/mps-root", list_strategies=(CDI_CRI,)
    )
    assert got.envs == MPS_ENV
    assert len(got.mounts) == 3


def test_mps_pipe_uses_the_renamed_resource() -> None:
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=2, rename="nvidia.com/gpu.shared")
    res = b.only(build_resources(b.snapshot(b.gpu(0)), b.settings(MIG_NONE, rule, strategy=MPS)))
    got = allocate(res, [replica_id(GPU0, 1)], mps_root="/run/nvidia/mps")
    assert got.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu.shared/pipe"


@pytest.mark.parametrize(
    ("resource", "root"),
    [(shared("time-slicing"), "/run/nvidia/mps"), (shared(MPS), "")],
    ids=["time-slicing", "no-mps-root"],
)
def test_no_mps_settings_without_an_mps_resource_and_root(resource: Resource, root: str) -> None:
    got = allocate(resource, [replica_id(GPU0, 0)], mps_root=root)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in got.envs
    assert got.mounts == ()


def test_no_mps_settings_for_an_unreplicated_resource_under_mps() -> None:
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=2, rename="nvidia.com/gpu.shared", devices=1)
    plan = b.settings(MIG_NONE, rule, strategy=MPS)
    got = b.by_name(build_resources(b.snapshot(*b.gpus(2)), plan))
    alloc = allocate(got["nvidia.com/gpu"], [GPU1], mps_root="/run/nvidia/mps")
    assert alloc.envs == {VISIBLE_DEVICES: GPU1}
    assert alloc.mounts == ()
