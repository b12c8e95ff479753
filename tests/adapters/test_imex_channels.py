"""Which IMEX channels exist: device nodes on a real node, `imex_channels` of a node file
on a simulated one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.adapters.fake import imex_channels, profile_names
from gpuslice.adapters.imex import existing_channels
from gpuslice.core.errors import ConfigError

CHANNELS = "dev/nvidia-caps-imex-channels"
NODE = "name: lab\ngpus: [{model: t4}]\n"


def channel_node(root: Path, target: str | None) -> None:
    """channel0 under `root`: a link to `target` (a character device), or a plain file."""
    directory = root / CHANNELS
    directory.mkdir(parents=True)
    if target is None:
        (directory / "channel0").write_text("")
    else:
        os.symlink(target, directory / "channel0")


def test_a_channel_whose_character_device_exists_is_found(tmp_path: Path) -> None:
    channel_node(tmp_path, os.devnull)
    assert existing_channels((0,), roots=(str(tmp_path),)) == {0}


def test_a_missing_channel_or_a_plain_file_is_not_a_channel(tmp_path: Path) -> None:
    """As upstream: only a character device counts."""
    assert existing_channels((0,), roots=(str(tmp_path),)) == frozenset()
    channel_node(tmp_path, None)
    assert existing_channels((0,), roots=(str(tmp_path),)) == frozenset()


def test_each_root_is_looked_in(tmp_path: Path) -> None:
    """The node may be at /dev in the container or under the mounted driver root."""
    driver_root = tmp_path / "driver-root"
    channel_node(driver_root, os.devnull)
    roots = (str(tmp_path / "empty"), "", str(driver_root))
    assert existing_channels((0, 1), roots=roots) == {0}


def test_a_node_file_lists_the_channels_that_exist(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(NODE + "imex_channels: [0]\n")
    assert imex_channels(str(node)) == {0}
    node.write_text(NODE)
    assert imex_channels(str(node)) == frozenset()


def test_no_built_in_profile_has_an_imex_channel() -> None:
    assert all(imex_channels(name) == frozenset() for name in profile_names())


@pytest.mark.parametrize("value", ["[-1]", "[0, 0]", "['0']", "0", "[true]"])
def test_a_bad_channel_list_is_one_line_naming_the_field(tmp_path: Path, value: str) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(NODE + f"imex_channels: {value}\n")
    with pytest.raises(ConfigError) as caught:
        imex_channels(str(node))
    assert str(caught.value).startswith(f"node file {node}: imex_channels")
    assert "\n" not in str(caught.value)
