"""ConfigMap manifests, mounted ConfigMap directories, files, and upstream's load-time rules."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from textwrap import dedent

import pytest

from gpuslice.config.loader import (
    MAX_BYTES,
    config_dir_entries,
    load_config,
    load_config_dir,
    load_config_file,
    load_configmap,
    select_config_name,
)
from gpuslice.core.errors import ConfigError

TS4 = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 4\n"
)
MPS2 = (
    "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
)

CONFIGMAP = """
apiVersion: v1
kind: ConfigMap
metadata:
  name: plugin-configs
data:
  ts: |
    version: v1
    sharing:
      timeSlicing:
        resources:
        - name: nvidia.com/gpu
          replicas: 4
  mps: |
    version: v1
    sharing:
      mps:
        resources:
        - name: nvidia.com/gpu
          replicas: 2
  broken: |
    version: v1
    flags: {migStrategy: bogus}
"""


def replicas_of(text: str, **kw: str) -> int:
    block = load_config(dedent(text), source="cm.yaml", **kw).config.sharing.replicated
    assert block is not None
    return block.resources[0].replicas


def error(fn: Callable[..., object], *args: object, **kw: object) -> str:
    with pytest.raises(ConfigError) as caught:
        fn(*args, **kw)
    return str(caught.value)


# ---- ConfigMap manifests


def test_configmap_entry_is_chosen_by_name_and_other_entries_are_not_parsed() -> None:
    """The "broken" entry does not stop a node that uses another one."""
    assert replicas_of(CONFIGMAP, name="ts") == 4
    assert replicas_of(CONFIGMAP, name="mps") == 2


def test_configmap_name_that_does_not_exist_lists_the_available_ones() -> None:
    assert error(load_config, dedent(CONFIGMAP), source="cm.yaml", name="a100") == (
        'cm.yaml: specified config "a100" does not exist; available: broken, mps, ts'
    )


def test_configmap_with_several_entries_needs_a_name() -> None:
    assert error(load_config, dedent(CONFIGMAP), source="cm.yaml") == (
        "cm.yaml: holds 3 configs (broken, mps, ts); name the one to use with --config-name"
    )


def test_configmap_with_one_entry_needs_no_name() -> None:
    single = "kind: ConfigMap\napiVersion: v1\ndata:\n  only: |\n" + "".join(
        f"    {line}\n" for line in TS4.splitlines()
    )
    loaded = load_config(single, source="cm.yaml")
    assert loaded.name == "only"
    assert loaded.source == "cm.yaml[only]"


def test_error_in_an_entry_names_the_entry() -> None:
    assert error(load_config, dedent(CONFIGMAP), source="cm.yaml", name="broken") == (
        'cm.yaml[broken]: flags.migStrategy: got "bogus"; expected one of none, single, mixed'
    )


def test_load_configmap_checks_every_entry() -> None:
    message = error(load_configmap, dedent(CONFIGMAP), source="cm.yaml")
    assert message.startswith("cm.yaml[broken]: flags.migStrategy")
    good = dedent(CONFIGMAP).split("  broken:")[0]
    assert sorted(load_configmap(good, source="cm.yaml")) == ["mps", "ts"]


def test_load_configmap_refuses_a_plain_config() -> None:
    assert error(load_configmap, TS4, source="c.yaml") == (
        "c.yaml: kind: missing; expected a ConfigMap manifest"
    )


def test_a_name_given_for_a_plain_config_is_an_error() -> None:
    assert error(load_config, TS4, source="c.yaml", name="ts") == (
        'c.yaml: a config name ("ts") was given, but this is not a ConfigMap'
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: v1\nkind: Pod\n", 'kind: got "Pod"; expected ConfigMap (or a plain config)'),
        ("apiVersion: v1\n", "kind: got null; expected ConfigMap (or a plain config)"),
        ("kind: ConfigMap\n", "data: the ConfigMap holds no configs"),
        ("kind: ConfigMap\ndata: [a]\n", 'data: got ["a"]; expected a mapping of named configs'),
        (
            "kind: ConfigMap\ndata: {1: x}\n",
            "data: key 1 is not a string; each config needs a text name",
        ),
        (
            "kind: ConfigMap\ndata: {a: {version: v1}}\n",
            'data.a: got {"version": "v1"}; expected the config\'s text (a YAML | block)',
        ),
    ],
)
def test_malformed_manifests_fail_with_one_line(text: str, message: str) -> None:
    assert error(load_config, text, source="cm.yaml") == f"cm.yaml: {message}"


def test_empty_entry_is_a_default_config() -> None:
    loaded = load_config("kind: ConfigMap\ndata: {empty: ''}\n", source="cm.yaml")
    assert loaded.config.sharing.replicated is None


# ---- names with extensions


def test_name_without_extension_finds_the_file() -> None:
    assert select_config_name(["a100.yaml", "t4.yaml"], "a100", source="d") == "a100.yaml"
    assert select_config_name(["a100.yaml", "a100"], "a100", source="d") == "a100"


def test_name_matching_two_extensions_is_ambiguous() -> None:
    assert error(select_config_name, ["a.json", "a.yaml"], "a", source="d") == (
        'd: specified config "a" is ambiguous; available: a.json, a.yaml'
    )


@pytest.mark.parametrize("wanted", [None, "a100"])
def test_nothing_to_choose_from(wanted: str | None) -> None:
    assert error(select_config_name, [], wanted, source="d") == (
        "d: holds no config files (entries starting with .. and subdirectories are skipped)"
    )


# ---- files and directories


@pytest.fixture
def tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="cfg"))
    yield path
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            os.unlink(full) if os.path.islink(full) else os.rmdir(full)
    os.rmdir(path)


def mounted_configmap(root: Path, entries: dict[str, str]) -> Path:
    """The layout the kubelet writes for a ConfigMap volume: a timestamped directory, a
    `..data` symlink to it, and one symlink per entry through `..data`."""
    stamped = root / "..2026_01_01_00_00_00.000000001"
    stamped.mkdir()
    for name, text in entries.items():
        (stamped / name).write_text(text)
    (root / "..data").symlink_to(stamped.name)
    for name in entries:
        (root / name).symlink_to(f"..data/{name}")
    return root


def test_directory_loads_every_entry_and_ignores_dot_dot_entries(tmp: Path) -> None:
    root = mounted_configmap(tmp, {"ts.yaml": TS4, "mps": MPS2})
    assert sorted(os.listdir(root))[:2] == ["..2026_01_01_00_00_00.000000001", "..data"]
    configs = load_config_dir(root)
    assert sorted(configs) == ["mps", "ts.yaml"]
    assert configs["mps"].config.sharing.strategy == "mps"
    assert configs["ts.yaml"].name == "ts.yaml"
    assert configs["ts.yaml"].source == str(root / "ts.yaml")
    assert sorted(config_dir_entries(root)) == ["mps", "ts.yaml"]


def test_directory_entry_is_chosen_by_name_with_or_without_extension(tmp: Path) -> None:
    root = mounted_configmap(tmp, {"ts.yaml": TS4, "mps": MPS2})
    assert load_config_file(root, name="ts").config.sharing.strategy == "time-slicing"
    assert load_config_file(root, name="ts").name == "ts.yaml"
    assert load_config_file(root, name="mps").config.sharing.strategy == "mps"
    assert error(load_config_file, root, name="a100") == (
        f'{root}: specified config "a100" does not exist; available: mps, ts.yaml'
    )


def test_bad_entry_in_a_directory_names_its_file(tmp: Path) -> None:
    root = mounted_configmap(tmp, {"bad": "flags: {migStrategy: x}\n"})
    assert error(load_config_dir, root).startswith(f"{root / 'bad'}: flags.migStrategy: got")


def test_file_errors_are_one_line(tmp: Path) -> None:
    assert error(load_config_file, tmp / "missing.yaml") == (
        f"{tmp / 'missing.yaml'}: cannot read: No such file or directory"
    )
    junk = tmp / "junk.bin"
    junk.write_bytes(b"\xff\xfe\x00binary")
    assert error(load_config_file, junk) == f'{junk}: not UTF-8 text (byte "ff" at offset 0)'
    big = tmp / "big.yaml"
    big.write_text("#" * (MAX_BYTES + 10))
    assert error(load_config_file, big) == f"{big}: larger than {MAX_BYTES} bytes; not a config"
    assert error(load_config_dir, tmp / "nope") == (
        f"{tmp / 'nope'}: cannot list the directory: No such file or directory"
    )


def test_dev_null_is_an_empty_config() -> None:
    """config-manager's "empty" fallback points the config at /dev/null."""
    assert load_config_file("/dev/null").config.sharing.replicated is None


def test_file_with_byte_order_mark_loads(tmp: Path) -> None:
    path = tmp / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + TS4.encode())
    assert load_config_file(path).config.sharing.strategy == "time-slicing"


# ---- upstream's load-time rules


def test_resources_block_is_validated_then_dropped_with_a_warning() -> None:
    loaded = load_config("resources: {gpus: [{pattern: 'A100*', name: a100}]}", source="c.yaml")
    assert loaded.config.resources.gpus == ()
    assert loaded.warnings == (
        "c.yaml: resources: custom resource naming is not supported (as upstream); ignored",
    )


def test_rename_is_reset_to_empty_or_to_the_shared_name() -> None:
    plain = load_config(TS4, source="c.yaml").config.sharing.replicated
    renamed_text = TS4.replace("timeSlicing:\n", "timeSlicing:\n    renameByDefault: true\n")
    renamed = load_config(renamed_text, source="c.yaml").config.sharing.replicated
    assert plain is not None
    assert renamed is not None
    assert plain.resources[0].rename == ""
    assert renamed.resources[0].rename == "nvidia.com/gpu.shared"
    assert renamed.resources[0].advertised_name == "nvidia.com/gpu.shared"


def test_an_explicit_rename_is_kept_and_wins_over_rename_by_default() -> None:
    """Per-GPU sharing honours `rename` (upstream strips it); renameByDefault only fills
    in entries without one, and a rename to the entry's own name means no rename."""
    text = TS4.replace("timeSlicing:\n", "timeSlicing:\n    renameByDefault: true\n")
    loaded = load_config(text + "      rename: my-gpu\n", source="c.yaml")
    block = loaded.config.sharing.replicated
    assert block is not None
    assert block.resources[0].rename == "nvidia.com/my-gpu"
    assert loaded.warnings == ()
    same = load_config(TS4 + "      rename: gpu\n", source="c.yaml").config.sharing.replicated
    assert same is not None
    assert same.resources[0].rename == ""


def test_devices_are_kept_for_per_gpu_sharing() -> None:
    loaded = load_config(TS4 + "      devices: [0, 1]\n", source="c.yaml")
    block = loaded.config.sharing.replicated
    assert block is not None
    assert block.resources[0].devices == (0, 1)
    assert loaded.warnings == ()


def test_devices_all_gives_no_warning() -> None:
    assert load_config(TS4 + "      devices: all\n", source="c.yaml").warnings == ()


def test_a_name_too_long_for_the_shared_suffix_cannot_reach_the_rename() -> None:
    """Every resource a GPU can have takes `.shared`; a longer name is refused first."""
    name = "g" * 50  # 61 characters with the prefix: a valid name, but no GPU has it
    text = TS4.replace("timeSlicing:\n", "timeSlicing:\n    renameByDefault: true\n").replace(
        "nvidia.com/gpu", name
    )
    message = error(load_config, text, source="c.yaml")
    assert message.startswith(f'c.yaml: sharing.timeSlicing.resources[0].name: got "{name}"; ')
    assert "a resource a GPU can have" in message


def test_mps_defaults_fail_requests_greater_than_one_to_true() -> None:
    sharing = load_config(MPS2, source="c.yaml").config.sharing
    assert sharing.mps is not None
    assert sharing.mps.fail_requests_greater_than_one is True
    assert sharing.fail_requests_greater_than_one is True


def test_time_slicing_defaults_fail_requests_greater_than_one_to_false() -> None:
    sharing = load_config(TS4, source="c.yaml").config.sharing
    assert sharing.time_slicing is not None
    assert sharing.time_slicing.fail_requests_greater_than_one is False


def test_mps_honours_an_explicit_false() -> None:
    text = MPS2.replace("mps:\n", "mps:\n    failRequestsGreaterThanOne: false\n")
    assert load_config(text, source="c.yaml").config.sharing.fail_requests_greater_than_one is False


def test_both_blocks_set_mps_wins_with_a_warning() -> None:
    text = TS4 + "  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"
    loaded = load_config(text, source="c.yaml")
    sharing = loaded.config.sharing
    assert sharing.strategy == "mps"
    assert sharing.replicated is sharing.mps
    assert loaded.warnings == (
        "c.yaml: sharing: both timeSlicing and mps are set; mps is used, timeSlicing is ignored",
    )


def test_no_sharing_block_means_strategy_none() -> None:
    sharing = load_config("flags: {migStrategy: mixed}", source="c.yaml").config.sharing
    assert sharing.strategy == "none"
    assert sharing.fail_requests_greater_than_one is False


def test_a_resource_listed_twice_warns_that_the_first_wins() -> None:
    text = TS4 + "    - name: gpu\n      replicas: 8\n"
    assert load_config(text, source="c.yaml").warnings == (
        "c.yaml: sharing.timeSlicing.resources[1].name: nvidia.com/gpu is listed more than "
        "once; the first entry is used",
    )
