"""Every field of the v1 schema decodes under its upstream (camelCase) name."""

from __future__ import annotations

import json
from textwrap import dedent

import pytest

from gpuslice.config.checks import FieldError
from gpuslice.config.decode import decode_config
from gpuslice.config.loader import load_config
from gpuslice.config.v1 import Config, ReplicatedResource

FULL = """
version: v1
flags:
  migStrategy: mixed
  failOnInitError: false
  mpsRoot: /run/nvidia/mps
  nvidiaDriverRoot: /run/nvidia/driver
  nvidiaDevRoot: /
  gdrcopyEnabled: true
  gdsEnabled: true
  mofedEnabled: true
  useNodeFeatureAPI: false
  deviceDiscoveryStrategy: nvml
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.example.com/
    nvidiaCTKPath: /usr/local/bin/nvidia-ctk
    containerDriverRoot: /host-driver
    sharedDevicesAllocationPolicy: packed
  gfd:
    oneshot: true
    noTimestamp: true
    sleepInterval: 1m30s
    outputFile: ""
    machineTypeFile: /tmp/product
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
imex:
  channelIDs: [0]
  required: true
"""


def load(text: str) -> Config:
    return load_config(dedent(text), source="t.yaml").config


def test_every_flag_field_is_read_under_its_upstream_name() -> None:
    config = load(FULL)
    flags = config.flags
    assert (flags.mig_strategy, flags.fail_on_init_error, flags.mps_root) == (
        "mixed",
        False,
        "/run/nvidia/mps",
    )
    assert (flags.nvidia_driver_root, flags.nvidia_dev_root) == ("/run/nvidia/driver", "/")
    assert (flags.gdrcopy_enabled, flags.gds_enabled, flags.mofed_enabled) == (True, True, True)
    assert flags.use_node_feature_api is False
    assert flags.device_discovery_strategy == "nvml"
    plugin = flags.plugin
    assert plugin.pass_device_specs is True
    assert plugin.list_strategies == ("envvar", "cdi-cri")
    assert plugin.device_id_strategy == "index"
    assert plugin.cdi_annotation_prefix == "cdi.example.com/"
    assert plugin.nvidia_ctk_path == "/usr/local/bin/nvidia-ctk"
    assert plugin.container_driver_root == "/host-driver"
    assert plugin.shared_devices_allocation_policy == "packed"
    gfd = flags.gfd
    assert (gfd.oneshot, gfd.no_timestamp, gfd.sleep_interval) == (True, True, "1m30s")
    assert (gfd.output_file, gfd.machine_type_file) == ("", "/tmp/product")
    assert config.imex.channel_ids == (0,)
    assert config.imex.required is True
    block = config.sharing.time_slicing
    assert block is not None
    assert block.fail_requests_greater_than_one is True
    assert block.resources == (ReplicatedResource(name="nvidia.com/gpu", replicas=4),)


def test_same_document_as_json_gives_the_same_config() -> None:
    import yaml

    as_json = json.dumps(yaml.safe_load(FULL))
    assert load_config(as_json, source="t.json").config == load(FULL)


def test_empty_file_is_version_v1_with_nothing_set() -> None:
    config = load("")
    assert config == Config()
    assert config.version == "v1"
    assert config.flags.mig_strategy is None
    assert config.sharing.replicated is None


@pytest.mark.parametrize("text", ["version: ''", "version:", "{}", "# only a comment\n"])
def test_empty_version_or_document_means_v1(text: str) -> None:
    assert load(text).version == "v1"


def test_blocks_left_empty_in_yaml_count_as_absent() -> None:
    """`flags:` with its children commented out is null in YAML; upstream accepts it."""
    config = load("flags:\n  plugin:\n  gfd:\nsharing:\n  timeSlicing:\nimex:\n")
    assert config == Config()


def test_device_list_strategy_takes_one_string_or_a_list() -> None:
    one = load("flags: {plugin: {deviceListStrategy: volume-mounts}}")
    many = load("flags: {plugin: {deviceListStrategy: [envvar, volume-mounts]}}")
    assert one.flags.plugin.list_strategies == ("volume-mounts",)
    assert many.flags.plugin.list_strategies == ("envvar", "volume-mounts")


def test_resource_names_get_the_nvidia_prefix() -> None:
    config = load(
        """
        sharing:
          timeSlicing:
            resources:
            - name: mig-1g.5gb
              replicas: 2
        """
    )
    block = config.sharing.time_slicing
    assert block is not None
    assert block.resources[0].name == "nvidia.com/mig-1g.5gb"


@pytest.mark.parametrize("duration", ["60s", "1m30s", "500ms", "1.5h", "2h45m", "infinite"])
def test_go_duration_strings_are_accepted(duration: str) -> None:
    assert load(f"flags: {{gfd: {{sleepInterval: '{duration}'}}}}").flags.gfd.sleep_interval == (
        duration
    )


@pytest.mark.parametrize(
    "devices",
    [
        "all",
        2,
        [0, 1],
        ["0", "1:2"],
        ["GPU-8f2a1c3e-1d4b-4c5a-9e8f-0a1b2c3d4e5f"],
        ["MIG-GPU-8f2a1c3e-1d4b-4c5a-9e8f-0a1b2c3d4e5f/1/0"],
        ["MIG-3b2a1c3e-aaaa-bbbb-cccc-dddddddddddd"],
        ["GPU-8F2A1C3E-1D4B-4C5A-9E8F-0A1B2C3D4E5F", 3, "2:0"],
    ],
)
def test_devices_accepts_all_a_count_or_a_list_of_references(devices: object) -> None:
    """Valid in the file (the loader then resets it to all, see test_config_loader)."""
    entry = {"name": "gpu", "replicas": 2, "devices": devices}
    raw = {"sharing": {"timeSlicing": {"resources": [entry]}}}
    block = decode_config(raw, "t.yaml").sharing.time_slicing
    assert block is not None
    expected = tuple(devices) if isinstance(devices, list) else devices
    assert block.resources[0].devices == expected


def test_flag_fields_left_out_stay_unset_so_precedence_can_fill_them() -> None:
    flags = load("flags: {migStrategy: single}").flags
    assert flags.mig_strategy == "single"
    assert flags.fail_on_init_error is None
    assert flags.plugin.device_list_strategy is None
    assert flags.gfd.sleep_interval is None


def test_a_config_built_in_code_is_checked_too() -> None:
    assert Config(version="").version == "v1"
    with pytest.raises(FieldError, match='version: got "v2"'):
        Config(version="v2")
    with pytest.raises(FieldError, match="replicas: got 1"):
        ReplicatedResource(name="gpu", replicas=1)
