"""Each flag lives in one place: its row in the flag table, and the one section field it
fills (config.flag_fields). Every check across sections runs where the options are
resolved, so a resolved RunOptions is valid and reading it never raises."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from gpuslice.config.flag_fields import flag_names
from gpuslice.config.flags import FLAGS, FLAGS_BY_NAME
from gpuslice.config.options import (
    DEFAULT_PLUGIN_DIR,
    SECTIONS,
    RunOptions,
    resolve_options,
)
from gpuslice.config.prometheus_access import PrometheusAccess
from gpuslice.core.errors import ConfigError

FILLED = [
    (s.__name__, f, flag)
    for s in (*SECTIONS, PrometheusAccess)
    for f, flag in flag_names(s).items()
]


def test_every_flag_fills_one_field_and_every_field_names_a_flag() -> None:
    """A setting outside the config file has one section field; a config-file setting
    (it lands in the config) and a flag accepted without effect may have none."""
    counts = Counter(flag for _, _, flag in FILLED)
    assert {flag for flag, n in counts.items() if n > 1} == set()
    assert {flag for flag in counts if flag not in FLAGS_BY_NAME} == set()
    unfilled = {f.name for f in FLAGS if f.name not in counts}
    assert {n for n in unfilled if FLAGS_BY_NAME[n].key is None and FLAGS_BY_NAME[n].uses} == set()
    assert {n for n in counts if not FLAGS_BY_NAME[n].uses} == set()  # no effect: no field


def test_run_options_is_a_record_of_sections() -> None:
    kinds = {f.name: f.type for f in dataclasses.fields(RunOptions)}
    sections = {s.__name__ for s in SECTIONS}
    assert sum(1 for kind in kinds.values() if kind in sections) == len(SECTIONS)
    assert len(kinds) <= len(SECTIONS) + 5  # flags, the simulated node, health from env


def test_each_section_field_takes_its_flag_from_the_command_line_and_env() -> None:
    given = {"status-address": ":9400", "mps-pinned-memory-limit": "512", "dra-mig-devices": "0"}
    env = {"GPUSLICE_DRA_DEVICE_PLUGIN_RESOURCES": "nvidia.com/gpu", "NODE_NAME": "n1"}
    opts = resolve_options(given, env, command="run")
    assert (opts.status.address, opts.mps.pinned_memory_limit_mib) == (":9400", 512)
    assert (opts.dra.mig_devices, opts.dra.device_plugin_resources) == (
        False,
        frozenset({"nvidia.com/gpu"}),
    )
    assert opts.api.node_name == "n1"
    default = resolve_options()
    assert (default.kubelet.socket, default.isolation.cgroup_root) == (
        FLAGS_BY_NAME["kubelet-socket"].default,
        "/sys/fs/cgroup",
    )


NO_NODE = (
    "per-node configs need this node's name to read its label; set --node-name or NODE_NAME "
    "(usually from the downward API, fieldPath spec.nodeName), otherwise every node would "
    "serve the default config"
)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"config-file-srcdir": "{dir}"},
         "--config-file-srcdir (CONFIG_FILE_SRCDIR) {dir}: " + NO_NODE),
        ({"config-file": "{dir}"}, "--config-file (CONFIG_FILE), a directory, {dir}: " + NO_NODE),
        ({"config-map": "cm"}, "--config-map (CONFIG_MAP) cm: " + NO_NODE),
        ({"config-map": "cm", "config-file-srcdir": "{dir}", "node-name": "n"},
         '--config-map (CONFIG_MAP) "cm" and the config directory {dir}: give one source of '
         "per-node configs, not both"),
    ],
)  # fmt: skip
def test_per_node_checks_fire_when_the_options_are_resolved(
    tmp_path: Path, given: dict[str, str], message: str
) -> None:
    values = {k: v.format(dir=tmp_path) for k, v in given.items()}
    with pytest.raises(ConfigError) as caught:
        resolve_options(values, command="run")
    assert str(caught.value) == message.format(dir=tmp_path)


def test_a_config_name_with_a_config_map_is_refused_when_resolved() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_options({"config-map": "cm", "node-name": "n"}, config_name="a")
    assert str(caught.value).startswith(
        '--config-name "a": not used with the per-node configs of ConfigMap cm;'
    )


def test_resolved_options_never_look_at_the_filesystem_again(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    configs.mkdir()
    opts = resolve_options({"config-file": str(configs), "node-name": "n1"}, command="run")
    configs.rmdir()
    assert (opts.source.dir, opts.source.per_node) == (str(configs), True)


def test_only_run_follows_per_node_configs(tmp_path: Path) -> None:
    """`labels` and `inspect` read a directory's entry by --config-name, as before."""
    opts = resolve_options({"config-file": str(tmp_path)}, command="labels", config_name="a")
    assert (opts.source.dir, opts.source.per_node, opts.source.name) == ("", False, "a")


def test_run_without_registering_gets_a_private_plugin_directory_when_resolved() -> None:
    opts = resolve_options({"kubelet-socket": ""}, command="run")
    assert opts.kubelet.own_plugin_dir
    path = opts.kubelet.plugin_dir
    assert os.path.dirname(path) == tempfile.gettempdir()
    assert os.path.basename(path).startswith("gpuslice-plugins-")
    assert not os.path.exists(path)  # named here; `run` creates it, mode 0700
    other = resolve_options({"kubelet-socket": ""}, command="run")
    assert other.kubelet.plugin_dir != path
    registering = resolve_options({"kubelet-socket": "/k/kubelet.sock"}, command="run")
    assert (registering.kubelet.plugin_dir, registering.kubelet.own_plugin_dir) == ("/k", False)
    elsewhere = resolve_options({"kubelet-socket": ""}, command="inspect")
    assert (elsewhere.kubelet.plugin_dir, elsewhere.kubelet.own_plugin_dir) == (
        DEFAULT_PLUGIN_DIR,
        False,
    )
    shutil.rmtree(path, ignore_errors=True)
