"""What the chart deploys, checked against the agent itself: the env vars and arguments are
ones `gpuslice run` reads and accepts, with the values the chart's settings mean; the probes
reach the agent's status endpoints; the RBAC is exactly RULES; host paths are mounted only
for the features that use them."""

from __future__ import annotations

import asyncio
import json
import posixpath
from typing import Any

import click
import pytest
import yaml
from chart_kit import (
    ADMISSION_MPS,
    CHART,
    CONFIGS,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    container,
    env,
    rendered,
    the,
    tool,
)
from click.testing import CliRunner

from gpuslice.adapters.kube import rbac
from gpuslice.adapters.nvml.backend import DRIVER_ROOT
from gpuslice.adapters.status_http import StatusServer
from gpuslice.cli import main as cli
from gpuslice.config.flags import FLAGS, FLAGS_BY_NAME, check_settings, resolve
from gpuslice.config.v1 import Config

# Read by the NVIDIA container runtime, not by the agent.
RUNTIME_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_MONITOR_DEVICES"}
RUN_ENV = {var for flag in FLAGS if flag.taken_by("run") for var in flag.env}
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
AGENT = ("template", "spec", "containers", 0)  # the agent container in a DaemonSet spec


def literal_env(objects: tuple[dict[str, Any], ...]) -> dict[str, str]:
    return {k: v for k, v in env(objects).items() if isinstance(v, str)}


def host_paths(objects: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, str, bool]]:
    """Host path -> (mount path, type, read-only) of the agent's hostPath volumes."""
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    out = {}
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            mount = mounts[volume["name"]]
            host = volume["hostPath"]
            out[host["path"]] = (mount["mountPath"], host["type"], mount.get("readOnly", False))
    return out


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_env_var_is_one_the_agent_or_the_nvidia_runtime_reads(name: str) -> None:
    extra = {var["name"] for var in VALUE_SETS[name].get("extraEnv", [])}
    names = set(env(rendered(name))) - extra
    assert names <= RUN_ENV | RUNTIME_ENV, names - RUN_ENV - RUNTIME_ENV


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_agent_accepts_every_literal_env_value(name: str) -> None:
    variables = literal_env(rendered(name))
    resolve(Config(), {}, variables)  # raises ConfigError naming the variable
    check_settings({}, variables)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_agent_accepts_every_argument(name: str) -> None:
    args = container(rendered(name))["args"]
    assert "command" not in container(rendered(name))  # the image's entrypoint: gpuslice
    assert args[0] == "run"
    run = cli.commands["run"]  # type: ignore[attr-defined]
    context = run.make_context("run", list(args[1:]), resilient_parsing=False)
    assert context.params["log_level"] in {"info", "debug"}


def test_the_node_pod_and_namespace_come_from_the_downward_api() -> None:
    variables = env(rendered("defaults"))
    assert variables["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert variables["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert variables["NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_defaults_leave_every_config_flag_to_the_config_file() -> None:
    variables = literal_env(rendered("defaults"))
    config_env = {var for flag in FLAGS if flag.key is not None for var in flag.env}
    set_by_chart = (set(variables) & config_env) - {"MPS_ROOT", "GFD_USE_NODE_FEATURE_API"}
    assert not set_by_chart
    effective = resolve(Config(), {}, variables)
    assert effective.flags.mps_root == ""  # MPS only with mps.enabled
    with_mps = resolve(Config(), {}, literal_env(rendered("mps")))
    assert with_mps.flags.mps_root == "/run/nvidia/mps"
    assert effective.flags.use_node_feature_api is True
    assert variables["GPUSLICE_LABELS"] == "true"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mig-mixed", {"mig_strategy": "mixed", "fail_on_init_error": False}),
        ("driver-root", {"nvidia_driver_root": "/run/nvidia/driver"}),
    ],
)
def test_flag_values_reach_the_agent_as_set(name: str, expected: dict[str, Any]) -> None:
    flags = resolve(Config(), {}, literal_env(rendered(name))).flags
    assert {key: getattr(flags, key) for key in expected} == expected


def test_a_device_list_given_as_a_list_reaches_the_agent_as_that_list() -> None:
    plugin = resolve(Config(), {}, literal_env(rendered("cdi-cri"))).flags.plugin
    assert plugin.list_strategies == ("cdi-cri", "envvar")
    assert plugin.device_id_strategy == "index"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_probes_reach_the_agents_status_endpoints(name: str) -> None:
    agent = container(rendered(name))
    settings = check_settings({}, literal_env(rendered(name)))
    kinds = ("startupProbe", "livenessProbe", "readinessProbe")
    if VALUE_SETS[name].get("hostNetwork"):  # over the pod's own socket (test_chart_host_ports)
        commands = [agent[p]["exec"]["command"] for p in kinds]
        assert [c[-2:] for c in commands] == [
            [settings["status-socket"], path] for path in ("/healthz", "/healthz", "/readyz")
        ]
        return
    address = settings["status-address"]
    port = next(p for p in agent["ports"] if p["name"] == "status")["containerPort"]
    assert address == f":{port}"
    probes = [agent[p]["httpGet"] for p in ("startupProbe", "livenessProbe", "readinessProbe")]
    assert all(p["port"] == "status" for p in probes)
    assert [p["path"] for p in probes] == ["/healthz", "/healthz", "/readyz"]


async def test_the_probe_paths_answer_200_on_the_agents_status_server() -> None:
    agent = container(rendered("defaults"))
    paths = {agent[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    async with StatusServer("127.0.0.1:0", lambda: (True, {})) as server:
        for path in paths:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status = await reader.readline()
            writer.close()
            assert status.startswith(b"HTTP/1.1 200"), (path, status)


CHOSEN_CONTEXT = {"compat-cpu-manager", "security-context", "nvidia-v020"}


@pytest.mark.parametrize("name", sorted(set(VALUE_SETS) - CHOSEN_CONTEXT))
def test_the_agent_keeps_no_capability_and_cannot_gain_privileges(name: str) -> None:
    context = container(rendered(name))["securityContext"]
    terminate = env(rendered(name)).get("GPUSLICE_MEMORY_BUDGET_POLICY") == "terminate"
    values = VALUE_SETS[name]
    mig = values.get("migStrategy") not in (None, "none")
    mounts = "volume-mounts" in str(values.get("deviceListStrategy"))
    # SYS_ADMIN only where MIG may be used, as NVIDIA's chart, or the driver sets per-pod
    # memory limits, or MIG layouts are made; KILL only to signal another user's process
    # over its memory budget.
    isolation = bool(values.get("memoryIsolation", {}).get("enabled"))
    mig = mig or bool(values.get("migManager", {}).get("enabled"))
    added = ["SYS_ADMIN"] * (mig or mounts or isolation) + ["KILL"] * terminate
    assert context["capabilities"] == {"drop": ["ALL"], **({"add": added} if added else {})}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert "privileged" not in context
    pod = the(rendered(name), "DaemonSet")["spec"]["template"]["spec"]
    assert "hostIPC" not in pod
    assert pod.get("hostNetwork", False) is values.get("hostNetwork", False)
    # Only the watchdog's terminate policy (host PIDs) needs the host's PIDs here; MPS
    # servers run in the mps-control pod (test_chart_mps).
    assert pod.get("hostPID", False) is terminate


def _host_pid(values: dict[str, Any]) -> bool:
    gen = tool()
    objects = tuple(gen.objects(gen.render(gen.CHART, values)))
    return bool(the(objects, "DaemonSet")["spec"]["template"]["spec"].get("hostPID", False))


MPS_JSON = '{"version": "v1", "sharing": {"mps": {"resources": [{"name": "gpu", "replicas": 2}]}}}'


@pytest.mark.parametrize(
    ("values", "host_pid"),
    [
        # never for MPS: its servers run in the mps-control pod (test_chart_mps)
        ({"config": {"map": {"m": ADMISSION_MPS}, "default": "m"}}, False),
        ({"config": {"map": {"m": MPS_JSON}, "default": "m"}, "mps": {"enabled": True}}, False),
        ({"config": {"map": CONFIGS, "default": "t4-ts-4"}}, False),
        ({"config": {"name": "theirs"}}, False),
        ({"config": {"name": "theirs"}, "mps": {"enabled": True}}, False),
        ({"mps": {"enabled": True, "enableHostPID": False}}, False),
        ({"memoryBudget": {"policy": "terminate"}, "mps": {"enableHostPID": False}}, True),
        ({"memoryBudget": {"policy": "terminate"}, "accounting": {"enabled": False}}, False),
    ],
)
def test_the_agents_pod_gets_the_host_pid_namespace_only_for_the_terminate_policy(
    values: dict[str, Any], host_pid: bool
) -> None:
    assert _host_pid(values) is host_pid


def test_by_default_only_the_kubelets_directories_and_proc_are_mounted() -> None:
    assert host_paths(rendered("defaults")) == {
        DEVICE_PLUGINS: (DEVICE_PLUGINS, "Directory", False),
        # accounting: the PodResources socket and each GPU process's cgroup
        "/var/lib/kubelet/pod-resources": ("/var/lib/kubelet/pod-resources", "Directory", True),
        "/proc": ("/host/proc", "Directory", True),
    }


def test_the_mps_root_is_created_and_mounted_only_when_mps_may_be_used() -> None:
    """Without mps.enabled nothing creates /run/nvidia/mps on the host, so an uninstall
    leaves no directory behind."""
    # MPS: the control daemons' directories, at the path Allocate hands to MPS clients
    mps = ("/run/nvidia/mps", "DirectoryOrCreate", False)
    assert host_paths(rendered("mps"))["/run/nvidia/mps"] == mps
    for name in set(VALUE_SETS) - {"mps"}:
        assert "/run/nvidia/mps" not in host_paths(rendered(name)), name
    assert posixpath.dirname(FLAGS_BY_NAME["kubelet-socket"].default_text) == DEVICE_PLUGINS


def test_a_cdi_strategy_mounts_the_cdi_spec_directory() -> None:
    spec_dir = FLAGS_BY_NAME["cdi-spec-dir"].default_text
    paths = host_paths(rendered("cdi-cri"))
    assert paths[spec_dir] == (spec_dir, "DirectoryOrCreate", False)
    # the static directory, read only, for the toolkit's spec
    assert paths["/etc/cdi"] == ("/etc/cdi", "DirectoryOrCreate", True)


def test_an_inline_config_with_a_cdi_strategy_mounts_it_too() -> None:
    config = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n"
    gen = tool()
    objects = tuple(gen.objects(gen.render(gen.CHART, {"config": {"map": {"c": config}}})))
    assert FLAGS_BY_NAME["cdi-spec-dir"].default_text in host_paths(objects)


def test_the_driver_root_is_mounted_read_only_where_the_agent_loads_nvml_from() -> None:
    mounted = host_paths(rendered("driver-root"))["/run/nvidia/driver"]
    assert mounted == (DRIVER_ROOT, "Directory", True)
    assert literal_env(rendered("driver-root"))["NVIDIA_DRIVER_ROOT"] == "/run/nvidia/driver"


def test_labels_to_a_file_mount_nfds_features_directory_where_the_agent_writes() -> None:
    objects = rendered("labels-file")
    output = FLAGS_BY_NAME["output-file"].default_text
    assert host_paths(objects)["/etc/nfd/features.d"] == (
        posixpath.dirname(output),
        "DirectoryOrCreate",
        False,
    )
    assert resolve(Config(), {}, literal_env(objects)).flags.use_node_feature_api is False


def test_labels_off_turns_the_labeller_off() -> None:
    variables = literal_env(rendered("labels-off"))
    assert check_settings({}, variables)["labels"] == "false"
    assert "GFD_USE_NODE_FEATURE_API" not in variables


def test_an_inline_config_map_is_created_mounted_and_chosen_per_node() -> None:
    objects = rendered("config-map-mount")
    configmap = the(objects, "ConfigMap")
    assert configmap["metadata"] == {
        "name": f"{RELEASE}-gpuslice-configs",
        "namespace": NAMESPACE,
        "labels": configmap["metadata"]["labels"],
    }
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == volume["name"])
    variables = literal_env(objects)
    assert variables["CONFIG_FILE_SRCDIR"] == mount["mountPath"]
    assert mount["readOnly"] is True
    assert variables["DEFAULT_CONFIG"] == "t4-ts-4"
    assert check_settings({}, variables)["fallback-strategies"] == ("named", "single")


def test_the_inline_configs_are_ones_the_agent_validates(tmp_path: Any) -> None:
    manifest = tmp_path / "configmap.yaml"
    manifest.write_text(yaml.safe_dump(the(rendered("config-map"), "ConfigMap")))
    result = CliRunner().invoke(cli, ["config", "validate", str(manifest)])
    assert result.exit_code == 0, result.output
    assert result.stdout.count(": valid") == 2


def test_an_existing_config_map_is_mounted_by_name_and_not_created() -> None:
    objects = rendered("config-name-mount")
    assert not [o for o in objects if o["kind"] == "ConfigMap"]
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert {"name": "my-configs"} in [v.get("configMap") for v in pod["volumes"]]
    assert "DEFAULT_CONFIG" not in literal_env(objects)


def test_fallback_strategies_reach_the_agent_as_set() -> None:
    variables = literal_env(rendered("config-name"))
    assert check_settings({}, variables)["fallback-strategies"] == ("named", "empty")


def test_simulate_runs_the_agent_on_the_simulated_profile() -> None:
    args = container(rendered("simulate"))["args"]
    assert "--fake-hardware=t4x4" in args
    assert not any(a.startswith("--fake-hardware") for a in container(rendered("defaults"))["args"])


def test_by_default_the_agent_runs_only_on_gpu_nodes_and_tolerates_their_taints() -> None:
    pod = the(rendered("defaults"), "DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]}
    assert {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"} <= keys
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in pod


def test_scheduling_values_replace_the_defaults() -> None:
    pod = the(rendered("scheduling"), "DaemonSet")["spec"]["template"]["spec"]
    assert "affinity" not in pod
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == VALUE_SETS["scheduling"]["tolerations"]
    assert pod["priorityClassName"] == "system-cluster-critical"


@pytest.mark.parametrize(
    ("name", "path", "expected"),
    [
        ("runtime-class", ("template", "spec", "runtimeClassName"), "nvidia"),
        ("on-delete", ("updateStrategy",), {"type": "OnDelete"}),
        ("rolling-2", ("updateStrategy", "rollingUpdate", "maxUnavailable"), 2),
        ("pull-secrets", ("template", "spec", "imagePullSecrets"), [{"name": "regcred"}]),
        ("pull-secrets", ("template", "metadata", "annotations"), {"example.com/team": "ml"}),
        ("pull-secrets", (*AGENT, "image"), "registry.example/gpuslice:1.2.3"),
        ("pull-secrets", (*AGENT, "imagePullPolicy"), "Always"),
        ("defaults", (*AGENT, "image"), "localhost/gpuslice:0.1.0"),
    ],
)
def test_pod_values_land_in_the_daemonset(name: str, path: tuple[Any, ...], expected: Any) -> None:
    node: Any = the(rendered(name), "DaemonSet")["spec"]
    for part in path:
        node = node[part]
    assert node == expected


def test_names_follow_fullname_override() -> None:
    objects = rendered("names")
    names = {o["metadata"]["name"] for o in objects}
    assert names == {"gpu-agent", "gpu-agent-metrics-reader"}
    assert "resources" not in container(objects)


def test_rbac_is_exactly_the_agents_rules_bound_to_its_service_account() -> None:
    objects = rendered("defaults")
    account = the(objects, "ServiceAccount")["metadata"]
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["name"]
    roles = {
        rbac.Scope.CLUSTER: the(objects, "ClusterRole"),
        rbac.Scope.NAMESPACE: the(objects, "Role", NAMESPACE),
    }
    assert rbac.rules_in(rbac.Scope.DEFAULT) == []  # Node Events: the cluster-wide rule
    assert not [o for o in objects if o["metadata"].get("namespace") == "default"]
    auth = [rule.policy_rule() for rule in rbac.METRICS_AUTH_RULES]  # metrics.auth kubernetes
    for scope, role in roles.items():
        extra = auth if scope is rbac.Scope.CLUSTER else []
        assert role["rules"] == rbac.rules_in(scope, {"config-map": ""}) + extra, scope
    bindings = [the(objects, "ClusterRoleBinding")]
    bindings += [the(objects, "RoleBinding", ns) for ns in (NAMESPACE,)]
    for binding, role in zip(bindings, roles.values(), strict=True):
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["roleRef"]["kind"] == role["kind"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
        ]
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            *("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role"),
            *("RoleBinding", "DaemonSet", "ClusterRole"),  # and the scrapers' ClusterRole
        ]
    )


def test_the_values_schema_allows_exactly_the_agents_choices() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    assert schema["migStrategy"]["enum"][1:] == list(FLAGS_BY_NAME["mig-strategy"].choices)
    assert schema["deviceIDStrategy"]["enum"][1:] == list(
        FLAGS_BY_NAME["device-id-strategy"].choices
    )
    strategies = schema["deviceListStrategy"]["anyOf"][2]["items"]["enum"]
    assert strategies == list(FLAGS_BY_NAME["device-list-strategy"].choices)
    run = cli.commands["run"]  # type: ignore[attr-defined]
    level = next(p for p in run.params if p.name == "log_level")
    assert isinstance(level.type, click.Choice)
    assert schema["log"]["properties"]["level"]["enum"] == list(level.type.choices)
