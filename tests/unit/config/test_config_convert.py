"""The config in core terms: ResourceSettings, AllocateOptions, the summary and the dump."""

from __future__ import annotations

import json

from gpuslice.config.convert import allocate_options, resource_settings
from gpuslice.config.decode import decode_config
from gpuslice.config.flags import resolve
from gpuslice.config.loader import load_config
from gpuslice.config.summary import describe, to_dict
from gpuslice.config.v1 import Config
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import ReplicaRule, ResourceSettings, SharingPlan


def config(text: str) -> Config:
    return load_config(text, source="c.yaml").config


MIXED_TS = config(
    "flags: {migStrategy: mixed}\n"
    "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
    "    - {name: gpu, replicas: 8}\n    - {name: mig-1g.5gb, replicas: 2}\n"
)
MPS = config(
    "flags: {mpsRoot: /run/nvidia/mps}\nsharing: {mps: {resources: [{name: gpu, replicas: 4}]}}"
)


def test_time_slicing_becomes_a_sharing_plan_with_renamed_rules() -> None:
    assert resource_settings(MIXED_TS) == ResourceSettings(
        mig_strategy="mixed",
        sharing=SharingPlan(
            strategy="time-slicing",
            rules=(
                ReplicaRule("nvidia.com/gpu", 8, "nvidia.com/gpu.shared"),
                ReplicaRule("nvidia.com/mig-1g.5gb", 2, "nvidia.com/mig-1g.5gb.shared"),
            ),
            fail_requests_greater_than_one=False,
        ),
    )


def test_mps_plan_fails_requests_greater_than_one_by_default() -> None:
    settings = resource_settings(MPS)
    assert settings.sharing == SharingPlan("mps", (ReplicaRule("nvidia.com/gpu", 4),), True)
    assert settings.mig_strategy == "none"


def test_no_sharing_gives_the_default_settings() -> None:
    assert resource_settings(Config()) == ResourceSettings()


def test_device_selection_kept_by_a_direct_decode_maps_to_core_form() -> None:
    """The loader resets devices; a config decoded without it still converts faithfully."""
    raw = {
        "sharing": {
            "timeSlicing": {
                "resources": [
                    {"name": "gpu", "replicas": 2, "devices": [0, "1:0"]},
                    {"name": "mig-1g.5gb", "replicas": 2, "devices": 3},
                ]
            }
        }
    }
    rules = resource_settings(decode_config(raw, "c.yaml")).sharing.rules
    assert [r.devices for r in rules] == [("0", "1:0"), 3]


def test_default_allocate_options_match_the_core_defaults() -> None:
    assert allocate_options(Config()) == AllocateOptions()


def test_allocate_options_carry_every_flag() -> None:
    text = (
        "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n  gdrcopyEnabled: true\n"
        "  gdsEnabled: true\n  mofedEnabled: true\n  mpsRoot: /mps\n"
        "  plugin:\n    passDeviceSpecs: true\n    deviceListStrategy: volume-mounts\n"
        "    deviceIDStrategy: index\n    cdiAnnotationPrefix: x.io/\n"
        "    sharedDevicesAllocationPolicy: packed\nimex: {channelIDs: [0]}\n"
    )
    assert allocate_options(config(text)) == AllocateOptions(
        list_strategies=("volume-mounts",),
        id_strategy="index",
        pass_device_specs=True,
        dev_root="/run/nvidia/driver",
        cdi_annotation_prefix="x.io/",
        gdrcopy_enabled=True,
        gds_enabled=True,
        mofed_enabled=True,
        mps_root="",  # not under MPS
        imex_channel_ids=(0,),
        allocation_policy="packed",
    )


def test_dev_root_prefers_nvidia_dev_root() -> None:
    text = "flags: {nvidiaDriverRoot: /driver, nvidiaDevRoot: /host}"
    assert allocate_options(config(text)).dev_root == "/host"


def test_mps_root_is_passed_only_while_mps_is_in_force() -> None:
    assert allocate_options(MPS).mps_root == "/run/nvidia/mps"
    assert allocate_options(resolve(MIXED_TS, {"mps-root": "/mps"}, {})).mps_root == ""


def test_describe_has_one_line_per_rule_and_the_strategies() -> None:
    assert describe(MIXED_TS).splitlines() == [
        "migStrategy: mixed",
        "sharing: time-slicing (failRequestsGreaterThanOne: false)",
        "  nvidia.com/gpu: 8 replicas, advertised as nvidia.com/gpu.shared",
        "  nvidia.com/mig-1g.5gb: 2 replicas, advertised as nvidia.com/mig-1g.5gb.shared",
        "deviceListStrategy: envvar",
        "deviceIDStrategy: uuid",
        "sharedDevicesAllocationPolicy: distributed",
    ]
    assert describe(Config()).splitlines()[1] == "sharing: none"
    assert describe(MPS).splitlines()[1] == "sharing: mps (failRequestsGreaterThanOne: true)"


def test_dump_is_json_with_file_names_and_decodes_back_to_the_same_config() -> None:
    effective = resolve(MIXED_TS, {}, {})
    data = to_dict(effective)
    assert json.loads(json.dumps(data)) == data
    assert data["flags"]["plugin"]["deviceIDStrategy"] == "uuid"
    assert data["sharing"]["timeSlicing"]["resources"][0]["name"] == "nvidia.com/gpu"
    assert decode_config(data, "dump") == effective
