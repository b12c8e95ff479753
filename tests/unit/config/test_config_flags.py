"""Flags and env vars: upstream's names, and precedence flag > env > file > default."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.config.flags import (
    FLAGS,
    FLAGS_BY_NAME,
    KUBELET_SOCKET,
    resolve,
    setting,
    with_defaults,
)
from gpuslice.config.loader import load_config
from gpuslice.config.v1 import Config
from gpuslice.core.errors import ConfigError


def file_config(text: str) -> Config:
    return load_config(text, source="c.yaml").config


FILE = file_config(
    "flags:\n  migStrategy: single\n  failOnInitError: false\n"
    "  plugin:\n    deviceListStrategy: [volume-mounts]\n"
)


# ---- precedence, for a string, a bool and a list


@pytest.mark.parametrize(
    ("cli", "env", "expected"),
    [
        ({"mig-strategy": "mixed"}, {"MIG_STRATEGY": "none"}, "mixed"),
        ({}, {"MIG_STRATEGY": "none"}, "none"),
        ({}, {}, "single"),
    ],
)
def test_string_flag_precedence(cli: dict[str, str], env: dict[str, str], expected: str) -> None:
    assert resolve(FILE, cli, env).flags.mig_strategy == expected


@pytest.mark.parametrize(
    ("cli", "env", "expected"),
    [
        ({"fail-on-init-error": "true"}, {"FAIL_ON_INIT_ERROR": "false"}, True),
        ({}, {"FAIL_ON_INIT_ERROR": "yes"}, True),
        ({}, {}, False),
    ],
)
def test_bool_flag_precedence(cli: dict[str, str], env: dict[str, str], expected: bool) -> None:
    assert resolve(FILE, cli, env).flags.fail_on_init_error is expected


@pytest.mark.parametrize(
    ("cli", "env", "expected"),
    [
        (
            {"device-list-strategy": "cdi-cri, envvar"},
            {"DEVICE_LIST_STRATEGY": "cdi-annotations"},
            ("cdi-cri", "envvar"),
        ),
        ({}, {"DEVICE_LIST_STRATEGY": "cdi-annotations"}, ("cdi-annotations",)),
        ({}, {}, ("volume-mounts",)),
    ],
)
def test_list_flag_precedence(
    cli: dict[str, str], env: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert resolve(FILE, cli, env).flags.plugin.list_strategies == expected


def test_built_in_defaults_fill_what_nothing_set() -> None:
    flags = resolve(Config(), {}, {}).flags
    assert flags.mig_strategy == "none"
    assert flags.fail_on_init_error is True
    assert flags.plugin.list_strategies == ("envvar",)
    assert flags.plugin.device_id_strategy == "uuid"
    assert flags.plugin.shared_devices_allocation_policy == "distributed"
    assert flags.plugin.nvidia_ctk_path == "/usr/bin/nvidia-ctk"
    assert flags.plugin.container_driver_root == "/driver-root"
    assert flags.plugin.cdi_annotation_prefix == "cdi.k8s.io/"
    assert flags.nvidia_driver_root == "/"
    assert flags.nvidia_dev_root is None  # falls back to the driver root where it is used
    assert flags.gfd.sleep_interval == "60s"
    assert flags.gfd.output_file == "/etc/kubernetes/node-feature-discovery/features.d/gfd"
    assert flags.use_node_feature_api is True
    assert resolve(Config(), {}, {}).imex.channel_ids == ()


def test_defaults_do_not_touch_sharing() -> None:
    config = file_config("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 3}]}}")
    assert with_defaults(config).sharing == config.sharing


def test_secondary_env_names_are_read() -> None:
    resolved = resolve(
        Config(),
        {},
        {
            "GFD_MIG_STRATEGY": "mixed",
            "NVIDIA_CTK_PATH": "/opt/ctk",
            "CONTAINER_DRIVER_ROOT": "/drv",
            "USE_NODE_FEATURE_API": "false",
        },
    )
    assert resolved.flags.mig_strategy == "mixed"
    assert resolved.flags.plugin.nvidia_ctk_path == "/opt/ctk"
    assert resolved.flags.plugin.container_driver_root == "/drv"
    assert resolved.flags.use_node_feature_api is False


def test_first_listed_env_var_wins_over_its_secondary_name() -> None:
    env = {"NVIDIA_CDI_HOOK_PATH": "/a", "NVIDIA_CTK_PATH": "/b"}
    assert resolve(Config(), {}, env).flags.plugin.nvidia_ctk_path == "/a"


@pytest.mark.parametrize("word", ["true", "TRUE", "1", "yes", "Yes"])
def test_true_words(word: str) -> None:
    assert resolve(Config(), {"pass-device-specs": word}, {}).flags.plugin.pass_device_specs is True


@pytest.mark.parametrize("word", ["false", "False", "0", "no", "NO"])
def test_false_words(word: str) -> None:
    assert resolve(Config(), {}, {"GDS_ENABLED": word}).flags.gds_enabled is False


def test_gfd_and_imex_settings_resolve() -> None:
    resolved = resolve(
        Config(),
        {"sleep-interval": "infinite", "imex-channel-ids": "0"},
        {"GFD_ONESHOT": "true", "IMEX_REQUIRED": "1", "GFD_OUTPUT_FILE": ""},
    )
    assert resolved.flags.gfd.sleep_interval == "infinite"
    assert resolved.flags.gfd.oneshot is True
    assert resolved.flags.gfd.output_file == ""  # empty means stdout, so it counts as set
    assert resolved.imex.channel_ids == (0,)
    assert resolved.imex.required is True


# ---- errors name the flag or the env var


@pytest.mark.parametrize(
    ("cli", "env", "message"),
    [
        (
            {"mig-strategy": "mix"},
            {},
            '--mig-strategy: got "mix"; expected one of none, single, mixed (did you mean mixed?)',
        ),
        (
            {},
            {"MIG_STRATEGY": "both"},
            'env MIG_STRATEGY: got "both"; expected one of none, single, mixed',
        ),
        (
            {},
            {"FAIL_ON_INIT_ERROR": "sometimes"},
            'env FAIL_ON_INIT_ERROR: got "sometimes"; expected true or false (1/0, yes/no)',
        ),
        (
            {"pass-device-specs": ""},
            {},
            '--pass-device-specs: got ""; expected true or false (1/0, yes/no)',
        ),
        (
            {"device-list-strategy": "envvar,cdi"},
            {},
            '--device-list-strategy: got "cdi"; expected one of envvar, volume-mounts, '
            "cdi-annotations, cdi-cri, or a list of them (did you mean cdi-cri?)",
        ),
        (
            {},
            {"DEVICE_LIST_STRATEGY": ""},
            "env DEVICE_LIST_STRATEGY: got []; expected one of envvar, volume-mounts, "
            "cdi-annotations, cdi-cri, or a list of them",
        ),
        (
            {},
            {"GFD_SLEEP_INTERVAL": "60"},
            'env GFD_SLEEP_INTERVAL: got "60"; expected a positive duration string such as "60s", '
            '"1m30s", "500ms" or "infinite" (a bare number is refused: upstream reads it as '
            "nanoseconds)",
        ),
        ({"imex-channel-ids": "1"}, {}, "--imex-channel-ids: got [1]; expected [] or [0]"),
        (
            {"imex-channel-ids": "\u00b2"},
            {},
            '--imex-channel-ids: got "\\u00b2"; expected comma-separated integers',
        ),
        (
            {"imex-channel-ids": "zero"},
            {},
            '--imex-channel-ids: got "zero"; expected comma-separated integers',
        ),
        (
            {},
            {"DEVICE_ID_STRATEGY": "serial"},
            'env DEVICE_ID_STRATEGY: got "serial"; expected uuid or index',
        ),
    ],
)
def test_bad_values_name_their_flag_or_env_var(
    cli: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(Config(), cli, env)
    assert str(caught.value) == message


def test_an_unknown_cli_key_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not flags of the table: nope"):
        resolve(Config(), {"nope": "1"}, {})


# ---- settings that are not in the config file


def test_kubelet_socket_default_env_and_empty() -> None:
    assert setting("kubelet-socket", {}, {}) == KUBELET_SOCKET
    assert setting("kubelet-socket", {}, {"KUBELET_SOCKET": "/k.sock"}) == "/k.sock"
    assert setting("kubelet-socket", {"kubelet-socket": ""}, {"KUBELET_SOCKET": "/k"}) == ""


def test_config_file_reads_both_env_names() -> None:
    assert setting("config-file", {}, {}) == ""
    assert setting("config-file", {}, {"GFD_CONFIG_FILE": "/g"}) == "/g"
    assert setting("config-file", {}, {"CONFIG_FILE": "/c", "GFD_CONFIG_FILE": "/g"}) == "/c"


# ---- the table itself


UPSTREAM = {
    "mig-strategy": ("MIG_STRATEGY", "flags.migStrategy"),
    "fail-on-init-error": ("FAIL_ON_INIT_ERROR", "flags.failOnInitError"),
    "pass-device-specs": ("PASS_DEVICE_SPECS", "flags.plugin.passDeviceSpecs"),
    "device-list-strategy": ("DEVICE_LIST_STRATEGY", "flags.plugin.deviceListStrategy"),
    "device-id-strategy": ("DEVICE_ID_STRATEGY", "flags.plugin.deviceIDStrategy"),
    "driver-root": ("NVIDIA_DRIVER_ROOT", "flags.nvidiaDriverRoot"),
    "dev-root": ("NVIDIA_DEV_ROOT", "flags.nvidiaDevRoot"),
    "gdrcopy-enabled": ("GDRCOPY_ENABLED", "flags.gdrcopyEnabled"),
    "gds-enabled": ("GDS_ENABLED", "flags.gdsEnabled"),
    "mofed-enabled": ("MOFED_ENABLED", "flags.mofedEnabled"),
    "cdi-annotation-prefix": ("CDI_ANNOTATION_PREFIX", "flags.plugin.cdiAnnotationPrefix"),
    "nvidia-cdi-hook-path": ("NVIDIA_CDI_HOOK_PATH", "flags.plugin.nvidiaCTKPath"),
    "driver-root-ctr-path": ("DRIVER_ROOT_CTR_PATH", "flags.plugin.containerDriverRoot"),
    "mps-root": ("MPS_ROOT", "flags.mpsRoot"),
    "shared-devices-allocation-policy": (
        "SHARED_DEVICES_ALLOCATION_POLICY",
        "flags.plugin.sharedDevicesAllocationPolicy",
    ),
    "device-discovery-strategy": ("DEVICE_DISCOVERY_STRATEGY", "flags.deviceDiscoveryStrategy"),
    "imex-channel-ids": ("IMEX_CHANNEL_IDS", "imex.channelIDs"),
    "imex-required": ("IMEX_REQUIRED", "imex.required"),
    "oneshot": ("GFD_ONESHOT", "flags.gfd.oneshot"),
    "no-timestamp": ("GFD_NO_TIMESTAMP", "flags.gfd.noTimestamp"),
    "sleep-interval": ("GFD_SLEEP_INTERVAL", "flags.gfd.sleepInterval"),
    "output-file": ("GFD_OUTPUT_FILE", "flags.gfd.outputFile"),
    "machine-type-file": ("GFD_MACHINE_TYPE_FILE", "flags.gfd.machineTypeFile"),
    "use-node-feature-api": ("GFD_USE_NODE_FEATURE_API", "flags.useNodeFeatureAPI"),
    "config-file": ("CONFIG_FILE", None),
    "kubelet-socket": ("KUBELET_SOCKET", None),
    # config-manager's and GFD's
    "node-name": ("NODE_NAME", None),
    "node-label": ("NODE_LABEL", None),
    "config-file-srcdir": ("CONFIG_FILE_SRCDIR", None),
    "default-config": ("DEFAULT_CONFIG", None),
    "fallback-strategies": ("FALLBACK_STRATEGIES", None),
    "namespace": ("NAMESPACE", None),
    "kubeconfig": ("KUBECONFIG", None),
    # ours
    "labels": ("GPUSLICE_LABELS", None),
    "status-address": ("GPUSLICE_STATUS_ADDRESS", None),
}


def test_table_has_upstreams_names_env_vars_and_config_paths() -> None:
    assert set(FLAGS_BY_NAME) == set(UPSTREAM)
    for name, (env, key) in UPSTREAM.items():
        assert FLAGS_BY_NAME[name].env[0] == env
        assert FLAGS_BY_NAME[name].key == key


def test_aliases_and_what_click_needs() -> None:
    assert FLAGS_BY_NAME["driver-root"].options == ("--driver-root", "--nvidia-driver-root")
    assert FLAGS_BY_NAME["output-file"].options == ("--output-file", "--output", "-o")
    assert FLAGS_BY_NAME["nvidia-cdi-hook-path"].options[1] == "--nvidia-ctk-path"
    assert FLAGS_BY_NAME["mig-strategy"].choices == ("none", "single", "mixed")
    assert FLAGS_BY_NAME["fail-on-init-error"].is_bool
    assert FLAGS_BY_NAME["fail-on-init-error"].default_text == "true"
    assert FLAGS_BY_NAME["device-list-strategy"].default_text == "envvar"
    assert (
        FLAGS_BY_NAME["shared-devices-allocation-policy"].param
        == "shared_devices_allocation_policy"
    )
    options = [o for f in FLAGS for o in f.options]
    assert len(options) == len(set(options))
    assert all(f.help for f in FLAGS)


def test_every_default_is_a_valid_value() -> None:
    """Defaults go through the same checks as file values (resolve would raise otherwise)."""
    cli = {f.name: f.default_text for f in FLAGS if f.key is not None and f.default is not None}
    assert resolve(Config(), cli, {}) == with_defaults(Config())


def test_config_reference_documents_every_flag_and_env_var() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "config.md").read_text()
    for flag in FLAGS:
        for word in (*flag.options, *flag.env, *((flag.key,) if flag.key else ())):
            assert f"`{word}`" in text, word
