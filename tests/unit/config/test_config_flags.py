"""Flags and env vars: upstream's names, and precedence flag > env > file > default."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.config.flags import (
    FLAGS,
    FLAGS_BY_NAME,
    KUBELET_SOCKET,
    GfdEnv,
    check_settings,
    command_env,
    resolve,
    setting,
    split_address,
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


# ---- GPU Feature Discovery reads its GFD_ names first; the plugin its unprefixed ones


@pytest.mark.parametrize(
    ("name", "gfd_var", "var", "gfd_value", "value"),
    [
        ("mig-strategy", "GFD_MIG_STRATEGY", "MIG_STRATEGY", "mixed", "single"),
        ("fail-on-init-error", "GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR", "false", "true"),
        ("use-node-feature-api", "GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API", "false",
         "true"),
    ],
)  # fmt: skip
def test_labeller_env_reads_the_gfd_name_first(
    name: str, gfd_var: str, var: str, gfd_value: str, value: str
) -> None:
    env = {gfd_var: gfd_value, var: value}
    attrs = {
        "mig-strategy": lambda c: c.flags.mig_strategy,
        "fail-on-init-error": lambda c: str(c.flags.fail_on_init_error).lower(),
        "use-node-feature-api": lambda c: str(c.flags.use_node_feature_api).lower(),
    }[name]
    assert attrs(resolve(Config(), {}, GfdEnv(env))) == gfd_value
    assert attrs(resolve(Config(), {"mig-strategy": "none"}, GfdEnv(env))) == (
        "none" if name == "mig-strategy" else gfd_value
    )


def test_plugin_env_reads_the_unprefixed_name_first() -> None:
    env = {"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "single", "GFD_FAIL_ON_INIT_ERROR": "0"}
    resolved = resolve(Config(), {}, env)
    assert resolved.flags.mig_strategy == "single"
    assert resolved.flags.fail_on_init_error is False  # the GFD_ name is still read alone


def test_labeller_config_file_reads_gfd_config_file_first() -> None:
    env = {"CONFIG_FILE": "/c", "GFD_CONFIG_FILE": "/g"}
    assert setting("config-file", {}, GfdEnv(env)) == "/g"
    assert setting("config-file", {}, env) == "/c"


def test_a_bad_gfd_value_is_named_as_the_gfd_variable() -> None:
    env = GfdEnv({"GFD_MIG_STRATEGY": "both", "MIG_STRATEGY": "none"})
    with pytest.raises(ConfigError, match=r"^env GFD_MIG_STRATEGY: got"):
        resolve(Config(), {}, env)


# ---- settings that are not in the config, checked


def test_settings_defaults() -> None:
    values = check_settings({}, {})
    assert values["cdi-feature-flags"] == ()
    assert values["cdi-disable-hooks"] == ()
    assert values["kube-api-qps"] == 5.0
    assert values["kube-api-burst"] == 10
    assert values["pod-name"] == ""
    assert values["kubelet-socket"] == KUBELET_SOCKET


def test_settings_given_are_parsed() -> None:
    values = check_settings(
        {"cdi-disable-hooks": "all", "kube-api-qps": "2.5"},
        {
            "CDI_FEATURE_FLAGS": "a,b",
            "KUBE_API_BURST": "20",
            "POD_NAME": "gfd-x",
            "FALLBACK_STRATEGIES": "named, empty",
        },
    )
    assert values["cdi-feature-flags"] == ("a", "b")
    assert values["cdi-disable-hooks"] == ("all",)
    assert values["kube-api-qps"] == 2.5
    assert values["kube-api-burst"] == 20
    assert values["pod-name"] == "gfd-x"
    assert values["fallback-strategies"] == ("named", "empty")
    assert setting("pod-name", {}, {"POD_NAME": "gfd-x"}) == "gfd-x"


def test_new_flags_help_and_defaults_text() -> None:
    assert FLAGS_BY_NAME["kube-api-qps"].default_text == "5"
    assert FLAGS_BY_NAME["kube-api-burst"].default_text == "10"
    assert FLAGS_BY_NAME["cdi-feature-flags"].default_text == ""
    assert "no effect" in FLAGS_BY_NAME["cdi-disable-hooks"].help


@pytest.mark.parametrize(
    ("cli", "env", "message"),
    [
        ({"kube-api-qps": "fast"}, {},
         '--kube-api-qps: got "fast"; expected a number of 0 or more, such as 5 or 2.5'),
        ({}, {"KUBE_API_QPS": "-1"},
         'env KUBE_API_QPS: got "-1"; expected a number of 0 or more, such as 5 or 2.5'),
        ({}, {"KUBE_API_QPS": "nan"},
         'env KUBE_API_QPS: got "nan"; expected a number of 0 or more, such as 5 or 2.5'),
        ({}, {"KUBE_API_BURST": "1.5"},
         'env KUBE_API_BURST: got "1.5"; expected an integer from 0 to 2147483647'),
        ({"kube-api-burst": ""}, {},
         '--kube-api-burst: got ""; expected an integer from 0 to 2147483647'),
        ({}, {"FALLBACK_STRATEGIES": "named,singel"},
         'env FALLBACK_STRATEGIES: got "singel"; expected one of named, single, empty '
         "(did you mean single?)"),
        ({"labels": "maybe"}, {}, '--labels: got "maybe"; expected one of auto, true, false'),
    ],
)  # fmt: skip
def test_bad_settings_name_their_flag_or_env_var(
    cli: dict[str, str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_settings(cli, env)
    assert str(caught.value) == message


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
    "cdi-feature-flags": ("CDI_FEATURE_FLAGS", None),
    "cdi-disable-hooks": ("CDI_DISABLE_HOOKS", None),
    # config-manager's and GFD's
    "node-name": ("NODE_NAME", None),
    "node-label": ("NODE_LABEL", None),
    "config-file-srcdir": ("CONFIG_FILE_SRCDIR", None),
    "default-config": ("DEFAULT_CONFIG", None),
    "fallback-strategies": ("FALLBACK_STRATEGIES", None),
    "namespace": ("NAMESPACE", None),
    "kubeconfig": ("KUBECONFIG", None),
    "kube-api-qps": ("KUBE_API_QPS", None),
    "kube-api-burst": ("KUBE_API_BURST", None),
    "pod-name": ("POD_NAME", None),
    # ours
    "config-map": ("CONFIG_MAP", None),
    "labels": ("GPUSLICE_LABELS", None),
    "status-address": ("GPUSLICE_STATUS_ADDRESS", None),
    "metrics-address": ("GPUSLICE_METRICS_ADDRESS", None),
    "metrics-auth": ("GPUSLICE_METRICS_AUTH", None),
    "status-socket": ("GPUSLICE_STATUS_SOCKET", None),
    "sample-interval": ("GPUSLICE_SAMPLE_INTERVAL", None),
    "pod-resources-socket": ("GPUSLICE_POD_RESOURCES_SOCKET", None),
    "accounting": ("GPUSLICE_ACCOUNTING", None),
    "proc-root": ("GPUSLICE_PROC_ROOT", None),
    "memory-budget-policy": ("GPUSLICE_MEMORY_BUDGET_POLICY", None),
    "mig-parted-config": ("MIG_PARTED_CONFIG_FILE", None),  # mig-manager's CONFIG_FILE
    "memory-isolation": ("GPUSLICE_MEMORY_ISOLATION", None),
    "cgroup-root": ("GPUSLICE_CGROUP_ROOT", None),
    "memory-budget": ("GPUSLICE_MEMORY_BUDGET", None),
    "dra": ("GPUSLICE_DRA", None),
    "dra-driver-name": ("GPUSLICE_DRA_DRIVER_NAME", None),
    "dra-device-plugin-resources": ("GPUSLICE_DRA_DEVICE_PLUGIN_RESOURCES", None),
    "dra-consumable-shares": ("GPUSLICE_DRA_CONSUMABLE_SHARES", None),
    "dra-taint-unhealthy": ("GPUSLICE_DRA_TAINT_UNHEALTHY", None),
    "dra-mig-devices": ("GPUSLICE_DRA_MIG_DEVICES", None),
    "dra-dynamic-mig": ("GPUSLICE_DRA_DYNAMIC_MIG", None),
    "dra-plugins-dir": ("GPUSLICE_DRA_PLUGINS_DIR", None),
    "dra-registry-dir": ("GPUSLICE_DRA_REGISTRY_DIR", None),
    "cdi-spec-dir": ("CDI_SPEC_DIR", None),
    "mps-control-binary": ("GPUSLICE_MPS_CONTROL_BINARY", None),
    "mps-control-socket": ("GPUSLICE_MPS_CONTROL_SOCKET", None),
    "mps-pinned-memory-limit": ("GPUSLICE_MPS_PINNED_MEMORY_LIMIT", None),
    # `gpuslice advise`
    "prometheus": ("GPUSLICE_PROMETHEUS_URL", None),
    "prometheus-bearer-token-file": ("GPUSLICE_PROMETHEUS_BEARER_TOKEN_FILE", None),
    "prometheus-ca-file": ("GPUSLICE_PROMETHEUS_CA_FILE", None),
    "prometheus-cert-file": ("GPUSLICE_PROMETHEUS_CERT_FILE", None),
    "prometheus-key-file": ("GPUSLICE_PROMETHEUS_KEY_FILE", None),
    "prometheus-insecure-skip-verify": ("GPUSLICE_PROMETHEUS_INSECURE_SKIP_VERIFY", None),
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


# ---- which commands take each flag


COMMANDS = {"run", "labels", "inspect", "mps-control", "advise"}
# How `gpuslice advise` reaches Prometheus: the agent has no use for them.
ADVISE_FLAGS = {
    "prometheus", "prometheus-bearer-token-file", "prometheus-ca-file", "prometheus-cert-file",
    "prometheus-key-file", "prometheus-insecure-skip-verify",
}  # fmt: skip
# GPU Feature Discovery's own flags: `gpuslice labels` takes each, as a GFD DaemonSet passes them.
GFD_FLAGS = {
    "mig-strategy", "fail-on-init-error", "mps-root", "driver-root", "dev-root",
    "gdrcopy-enabled", "gds-enabled", "mofed-enabled", "use-node-feature-api",
    "device-discovery-strategy", "oneshot", "no-timestamp", "sleep-interval", "output-file",
    "machine-type-file", "config-file", "driver-root-ctr-path", "kubeconfig", "kube-api-qps",
    "kube-api-burst", "namespace", "node-name", "pod-name",
}  # fmt: skip


def test_every_flag_names_only_known_commands_once() -> None:
    for flag in FLAGS:
        assert flag.uses | flag.accepts <= COMMANDS, flag.name
        assert not flag.uses & flag.accepts, flag.name


def test_the_agent_takes_every_flag_and_the_labeller_exactly_gfds() -> None:
    """A plugin DaemonSet's and a GFD DaemonSet's arguments keep working unchanged."""
    assert all(
        flag.taken_by("run") or flag.name == "oneshot" or flag.name in ADVISE_FLAGS
        for flag in FLAGS
    )
    assert {flag.name for flag in FLAGS if flag.taken_by("labels")} == GFD_FLAGS
    assert {flag.name for flag in FLAGS if flag.taken_by("advise")} == ADVISE_FLAGS


def test_inspect_takes_only_what_changes_its_report() -> None:
    taken = {flag.name for flag in FLAGS if flag.taken_by("inspect")}
    assert taken == {
        "mig-strategy", "mps-root", "machine-type-file", "config-file", "driver-root-ctr-path",
        "mps-pinned-memory-limit", "cdi-spec-dir",
        # --dra: the ResourceSlices of the node, named after it
        "dra", "dra-driver-name", "dra-device-plugin-resources", "dra-consumable-shares",
        "dra-taint-unhealthy", "dra-mig-devices", "dra-dynamic-mig", "node-name",
        # the cgroup facts of each GPU's memory isolation, the limits and the label
        "cgroup-root", "memory-isolation",
    }  # fmt: skip


def test_a_command_reads_only_the_env_vars_of_its_flags() -> None:
    environ = {"KUBELET_SOCKET": "/k", "MIG_STRATEGY": "mixed", "HOME": "/root", "GFD_ONESHOT": "1"}
    assert command_env("inspect", environ) == {"MIG_STRATEGY": "mixed", "HOME": "/root"}
    assert command_env("labels", environ) == {
        "MIG_STRATEGY": "mixed", "HOME": "/root", "GFD_ONESHOT": "1"
    }  # fmt: skip
    assert "KUBELET_SOCKET" in command_env("run", environ)


# ---- the status address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":8080", ("", 8080)),
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("[::1]:0", ("::1", 0)),
        ("node.example:65535", ("node.example", 65535)),
        ("abc", None),
        ("::::", None),
        ("::1:8080", None),  # IPv6 needs brackets
        ("127.0.0.1:99999", None),
        ("127.0.0.1:-1", None),
        ("127.0.0.1:", None),
        ("a b:80", None),
    ],
)
def test_split_address(text: str, expected: tuple[str, int] | None) -> None:
    assert split_address(text) == expected


def test_a_malformed_status_address_is_refused_naming_the_env_var() -> None:
    with pytest.raises(ConfigError, match=r'^env GPUSLICE_STATUS_ADDRESS: got "8080"; expected'):
        check_settings({}, {"GPUSLICE_STATUS_ADDRESS": "8080"})
    assert check_settings({"status-address": ""}, {})["status-address"] == ""


def test_a_malformed_metrics_address_is_refused_naming_the_env_var() -> None:
    with pytest.raises(ConfigError, match=r'^env GPUSLICE_METRICS_ADDRESS: got "9400"; expected'):
        check_settings({}, {"GPUSLICE_METRICS_ADDRESS": "9400"})
    assert check_settings({}, {})["metrics-address"] == ""


@pytest.mark.parametrize("bad", ["10", "", "-1s", "0s", "infinite", "ten seconds"])
def test_a_sample_interval_must_be_a_positive_duration(bad: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^env GPUSLICE_SAMPLE_INTERVAL: got .*positive duration"
    ):
        check_settings({}, {"GPUSLICE_SAMPLE_INTERVAL": bad})
    assert check_settings({}, {})["sample-interval"] == "10s"
    assert check_settings({"sample-interval": "500ms"}, {})["sample-interval"] == "500ms"
