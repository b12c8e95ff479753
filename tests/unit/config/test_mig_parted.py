"""NVIDIA's mig-parted config is read unchanged, and every mistake is one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.config.loader import MAX_BYTES
from gpuslice.config.mig_parted import load_mig_parted_file, parse_mig_parted
from gpuslice.core.errors import ConfigError
from gpuslice.core.mig import DeviceFilter, MigConfigEntry

DEFAULTS = Path(__file__).parent / "mig_parted" / "default-mig-parted-config.yaml"
A100_40GB = ("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE")


def test_the_gpu_operators_default_config_is_read_unchanged() -> None:
    config = load_mig_parted_file(DEFAULTS)
    assert set(config.configs) == {
        "all-disabled", "all-enabled", "all-1g.5gb", "all-1g.5gb.me", "all-2g.10gb",
        "all-3g.20gb", "all-4g.20gb", "all-7g.40gb", "all-1g.10gb", "all-3g.40gb",
        "all-7g.80gb", "all-1g.18gb", "all-3g.71gb", "all-7g.141gb", "all-balanced",
    }  # fmt: skip
    assert config.entries("all-disabled") == (MigConfigEntry(None, False),)
    assert config.entries("all-enabled") == (MigConfigEntry(None, True),)
    a100 = tuple(DeviceFilter(int(i, 16)) for i in A100_40GB)
    assert config.entries("all-1g.5gb.me") == (
        MigConfigEntry(None, True, (("1g.5gb+me", 1),), a100),
    )
    per_part = [dict(e.mig_devices) for e in config.entries("all-1g.10gb")]
    assert per_part == [{"1g.10gb": 7}, {"1g.10gb": 4}]
    balanced = config.entries("all-balanced")
    assert [dict(e.mig_devices) for e in balanced] == [
        {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
        {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
        {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    ]
    assert balanced[2].device_filter == (DeviceFilter(0x233510DE), DeviceFilter(0x233B10DE))


def test_explicit_indexes_a_single_filter_and_a_subsystem_id_are_read() -> None:
    config = parse_mig_parted(
        "version: v1\nmig-configs:\n  mine:\n"
        "    - devices: [0, 2]\n      device-filter: '0x20b010de:0x134F10DE'\n"
        "      mig-enabled: true\n      mig-devices: {1c.3g.20gb: 2, 1g.5gb: 0}\n",
        "f.yaml",
    )
    assert config.entries("mine") == (
        MigConfigEntry(
            (0, 2),
            True,
            (("1c.3g.20gb", 2), ("1g.5gb", 0)),
            (DeviceFilter(0x20B010DE, 0x134F10DE),),
        ),
    )


ENTRY = "version: v1\nmig-configs:\n  c:\n    - "


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\nmig-configs: {}\n", 'f.yaml: version: got "v2"; expected v1'),
        ("mig-configs: {}\n", "f.yaml: version: got null; expected v1"),
        (
            "version: v1\nmig-config: {}\n",
            "f.yaml: mig-config: unknown key; did you mean mig-configs?",
        ),
        ("version: v1\nmig-configs: [a]\n", 'f.yaml: mig-configs: got ["a"]; expected a mapping'),
        ("version: v1\nmig-configs:\n  c: []\n", "f.yaml: mig-configs.c: got []; expected a list"),
        (ENTRY + "{devices: all}\n", "f.yaml: mig-configs.c[0].mig-enabled: missing"),
        (ENTRY + "{mig-enabled: false}\n", "f.yaml: mig-configs.c[0].devices: missing"),
        (
            ENTRY + "{devices: all, mig-enabled: false, mig-device: {}}\n",
            "f.yaml: mig-configs.c[0].mig-device: unknown key; did you mean mig-devices?",
        ),
        (
            ENTRY + "{devices: all, mig-enabled: 'yes'}\n",
            'f.yaml: mig-configs.c[0].mig-enabled: got "yes"; expected true or false',
        ),
        (
            ENTRY + "{devices: all, mig-enabled: true}\n",
            "f.yaml: mig-configs.c[0].mig-devices: missing; required when mig-enabled is true",
        ),
        (
            ENTRY + "{devices: all, mig-enabled: false, mig-devices: {}}\n",
            "f.yaml: mig-configs.c[0].mig-devices: not allowed when mig-enabled is false",
        ),
        (
            ENTRY + "{devices: some, mig-enabled: false}\n",
            'f.yaml: mig-configs.c[0].devices: got "some"; expected all, or a list of GPU indexes',
        ),
        (
            ENTRY + "{devices: [0, 0], mig-enabled: false}\n",
            "f.yaml: mig-configs.c[0].devices: got [0, 0]; a GPU index is listed twice",
        ),
        (
            ENTRY + "{devices: all, mig-enabled: true, mig-devices: {1g: 1}}\n",
            'f.yaml: mig-configs.c[0].mig-devices: key "1g": expected a MIG profile',
        ),
        (
            ENTRY + "{devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}\n",
            "f.yaml: mig-configs.c[0].mig-devices.1g.5gb: got -1; expected a count >= 0",
        ),
        (
            ENTRY + "{devices: all, mig-enabled: false, device-filter: [20B010DE]}\n",
            'f.yaml: mig-configs.c[0].device-filter: got "20B010DE"; expected a PCI device ID',
        ),
        ("version: v1\nmig-configs: {c: [\n", "f.yaml: line 3, column 1: not valid YAML"),
    ],
)
def test_a_mistake_is_one_line_naming_the_file_and_the_path(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mig_parted(text, "f.yaml")
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_name_absent_from_the_file_is_refused_naming_a_close_one() -> None:
    config = load_mig_parted_file(DEFAULTS)
    with pytest.raises(ConfigError, match=r"mig-configs: no config \"all-1g.5g\"; did you mean"):
        config.entries("all-1g.5g")
    with pytest.raises(ConfigError, match=r"no config \"mine\"; it has: all-disabled, all-en"):
        config.entries("mine")


def test_the_file_is_read_bounded_and_only_when_regular(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("version: v1\n" + "#" * MAX_BYTES)
    with pytest.raises(ConfigError, match=rf"big\.yaml: larger than {MAX_BYTES} bytes"):
        load_mig_parted_file(big)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nothing writes it: a blocking read would never return
    with pytest.raises(ConfigError, match="fifo: not a regular file"):
        load_mig_parted_file(fifo)
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read"):
        load_mig_parted_file(tmp_path / "absent.yaml")
