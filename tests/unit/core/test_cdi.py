"""build_specs: the CDI specs that resolve every CDI name Allocate can return."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from gpuslice.core.cdi import build_specs, qualified_names, spec_file_name
from gpuslice.core.container_spec import container_allocation
from gpuslice.core.resources import Resource, build_resources
from gpuslice.core.response import (
    CDI_ANNOTATIONS,
    CDI_CRI,
    ENVVAR,
    ID_INDEX,
    ID_UUID,
    AllocateOptions,
)
from gpuslice.core.sharing import MIG_MIXED, MIG_NONE, ReplicaRule

from .builders import gpu, gpu_uuid, gpus, mig_uuid, settings, snapshot

GPU_SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
IMEX_SPEC = "k8s.device-plugin.nvidia.com-imex-channel.json"
CDI = AllocateOptions(list_strategies=(CDI_CRI,))


def specs(resources: Sequence[Resource], opts: AllocateOptions = CDI, **kw: Any) -> dict[str, Any]:
    return {name: json.loads(text) for name, text in build_specs(resources, opts, **kw).items()}


def whole(count: int) -> tuple[Resource, ...]:
    return build_resources(snapshot(*gpus(count)), settings())


def mig_mixed() -> tuple[Resource, ...]:
    """GPU 0 split into two 1g.5gb and one 2g.10gb devices, GPU 1 whole and 4x time-sliced."""
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=4)
    hw = snapshot(gpu(0, profiles=["1g.5gb", "1g.5gb", "2g.10gb"]), gpu(1))
    return build_resources(hw, settings(MIG_MIXED, rule))


def test_whole_gpus_get_their_device_node_and_the_common_driver_nodes() -> None:
    got = specs(whole(2), control_devices=("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"))
    assert got == {
        GPU_SPEC: {
            "cdiVersion": "0.3.0",  # nothing newer is used
            "kind": "k8s.device-plugin.nvidia.com/gpu",
            "devices": [
                {
                    "name": gpu_uuid(i),
                    "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]},
                }
                for i in range(2)
            ],
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [
                    {"path": "/dev/nvidiactl"},
                    {"path": "/dev/nvidia-uvm"},
                    {"path": "/dev/nvidia-uvm-tools"},
                ],
            },
        }
    }


def test_replicas_of_a_gpu_are_one_cdi_device() -> None:
    """Allocate collapses replicas to the GPU's UUID, so the spec names GPUs, not replicas."""
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=4)
    resources = build_resources(snapshot(*gpus(2)), settings(MIG_NONE, rule))
    assert len(resources[0].devices) == 8
    names = [d["name"] for d in specs(resources)[GPU_SPEC]["devices"]]
    assert names == [gpu_uuid(0), gpu_uuid(1)]


def test_a_mig_device_injects_its_parent_node_and_its_capability_nodes() -> None:
    devices = {d["name"]: d for d in specs(mig_mixed())[GPU_SPEC]["devices"]}
    assert devices[mig_uuid(0, 1)]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        {"path": "/dev/nvidia-caps/nvidia-cap102"},
        {"path": "/dev/nvidia-caps/nvidia-cap103"},
    ]
    assert set(devices) == {mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(0, 2), gpu_uuid(1)}


def test_index_names_need_cdi_0_5_0() -> None:
    """Names starting with a digit ("0", "0:1") are valid from CDI 0.5.0 on."""
    got = specs(mig_mixed(), AllocateOptions(list_strategies=(CDI_CRI,), id_strategy=ID_INDEX))
    spec = got[GPU_SPEC]
    assert spec["cdiVersion"] == "0.5.0"
    assert {d["name"] for d in spec["devices"]} == {"0:0", "0:1", "0:2", "1"}


def test_a_dev_root_becomes_host_paths_which_need_cdi_0_5_0() -> None:
    opts = AllocateOptions(list_strategies=(CDI_CRI,), dev_root="/run/nvidia/driver")
    spec = specs(whole(1), opts)[GPU_SPEC]
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/run/nvidia/driver/dev/nvidia0"}
    ]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/run/nvidia/driver/dev/nvidiactl"}
    ]


@pytest.mark.parametrize("strategies", [(ENVVAR,), ()])
def test_without_a_cdi_strategy_there_is_no_spec(strategies: tuple[str, ...]) -> None:
    assert build_specs(whole(2), AllocateOptions(list_strategies=strategies)) == {}


def test_a_cdi_strategy_beside_envvar_still_gets_its_spec() -> None:
    opts = AllocateOptions(list_strategies=(ENVVAR, CDI_ANNOTATIONS))
    assert list(build_specs(whole(1), opts)) == [GPU_SPEC]


def test_imex_channels_and_extras_get_a_spec_per_kind() -> None:
    opts = AllocateOptions(
        list_strategies=(CDI_CRI,), imex_channel_ids=(0,), gds_enabled=True, mofed_enabled=True
    )
    got = specs(whole(1), opts, extra_nodes={"gds": ("/dev/nvidia-fs0", "/dev/nvidia-fs1")})
    assert set(got) == {
        GPU_SPEC,
        IMEX_SPEC,
        "k8s.device-plugin.nvidia.com-gds.json",
        "k8s.device-plugin.nvidia.com-mofed.json",
    }
    assert got[IMEX_SPEC] == {
        "cdiVersion": "0.5.0",
        "kind": "k8s.device-plugin.nvidia.com/imex-channel",
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/nvidia-caps-imex-channels/channel0"}]
                },
            }
        ],
    }
    gds = got["k8s.device-plugin.nvidia.com-gds.json"]["devices"]
    assert gds == [
        {
            "name": "all",
            "containerEdits": {
                "env": ["NVIDIA_GDS=enabled"],
                "deviceNodes": [{"path": "/dev/nvidia-fs0"}, {"path": "/dev/nvidia-fs1"}],
            },
        }
    ]
    # No MOFED device node on this node: the env var keeps the device valid (non-empty).
    mofed = got["k8s.device-plugin.nvidia.com-mofed.json"]["devices"]
    assert mofed == [{"name": "all", "containerEdits": {"env": ["NVIDIA_MOFED=enabled"]}}]


def test_no_devices_no_gpu_spec_but_imex_channels_still_resolve() -> None:
    opts = AllocateOptions(list_strategies=(CDI_CRI,), imex_channel_ids=(3,))
    assert list(build_specs((), opts)) == [IMEX_SPEC]


ALL_OPTIONS = [
    AllocateOptions(
        list_strategies=strategies,
        id_strategy=ids,
        imex_channel_ids=imex,
        gdrcopy_enabled=extras,
        gds_enabled=extras,
        mofed_enabled=extras,
    )
    for strategies in ((CDI_CRI,), (CDI_ANNOTATIONS,), (ENVVAR, CDI_CRI, CDI_ANNOTATIONS))
    for ids in (ID_UUID, ID_INDEX)
    for imex in ((), (0, 5))
    for extras in (False, True)
]


@pytest.mark.parametrize("opts", ALL_OPTIONS)
@pytest.mark.parametrize("layout", ["whole", "time-sliced", "mig-mixed"])
def test_every_name_allocate_can_return_resolves(opts: AllocateOptions, layout: str) -> None:
    """Each device alone and all devices of a resource together, for every option mix."""
    resources = {"whole": whole(3), "mig-mixed": mig_mixed()}.get(layout) or build_resources(
        snapshot(*gpus(2)), settings(MIG_NONE, ReplicaRule(name="nvidia.com/gpu", replicas=3))
    )
    resolvable = set().union(*(qualified_names(s) for s in specs(resources, opts).values()))
    for resource in resources:
        for devices in [*([d] for d in resource.devices), resource.devices]:
            alloc = container_allocation(resource, devices, opts, token="t")
            returned = [*alloc.cdi_devices, *(",".join(alloc.annotations.values()).split(","))]
            names = {n for n in returned if n}
            assert names
            assert names <= resolvable


def test_the_same_input_renders_the_same_text() -> None:
    """Unchanged hardware and options must not look like a change to the writer."""
    assert build_specs(mig_mixed(), CDI) == build_specs(mig_mixed(), CDI)


def test_spec_file_name_is_vendor_dash_class() -> None:
    assert spec_file_name("k8s.device-plugin.nvidia.com/gpu") == GPU_SPEC
