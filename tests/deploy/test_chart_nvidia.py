"""A user of NVIDIA's chart v0.20 moves over: its values file installs unchanged, the values
that mean something here are honoured as NVIDIA's templates honour them, those that do not are
accepted and NOTES.txt says what gpuslice does instead; no rendering can hand the NVIDIA
runtime NVIDIA_MIG_MONITOR_DEVICES in a container without CAP_SYS_ADMIN; and the default node
selection survives NFD pruning its labels."""

from __future__ import annotations

import copy
import hashlib
import itertools
import re
from typing import Any

import helm_python as helm
import pytest
import yaml
from chart_kit import (
    CHART,
    MANIFESTS,
    NVIDIA_VALUES,
    NVIDIA_VALUES_FILE,
    container,
    env,
    is_hook,
    kube_versions,
    rendered,
    schema_errors,
    the,
    tool,
)
from schedule_kit import selects

from gpuslice.config.flags import check_settings, resolve
from gpuslice.config.v1 import Config

MIG_MONITOR = "NVIDIA_MIG_MONITOR_DEVICES"
# sha256 of NVIDIA's file as published: the test data is that file, unedited.
NVIDIA_SHA256 = "ad339b160fc56d4ab4648a88e79b1eed277a15142e2e314734ee17bcd672b648"


def render(values: dict[str, Any], namespace: str = "gpu-system") -> dict[str, str]:
    return dict(tool().render(CHART, values, release="gpu", namespace=namespace, notes=True))


def objects_of(out: dict[str, str]) -> tuple[dict[str, Any], ...]:
    return tuple(tool().objects({k: v for k, v in out.items() if not k.endswith("NOTES.txt")}))


def notes_of(out: dict[str, str]) -> str:
    return " ".join(out["gpuslice/templates/NOTES.txt"].split())


def holds_sys_admin(context: dict[str, Any]) -> bool:
    added = {str(c).upper() for c in (context.get("capabilities") or {}).get("add") or []}
    return bool(context.get("privileged")) or bool(added & {"SYS_ADMIN", "CAP_SYS_ADMIN", "ALL"})


def containers(objects: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """Every container of every pod template the objects hold."""
    out = []
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        out += pod.get("containers", []) + pod.get("initContainers", [])
    return out


def refused_by_the_runtime(objects: tuple[dict[str, Any], ...]) -> list[str]:
    """Containers nvidia-container-toolkit's legacy hook would refuse to start."""
    return [
        c["name"]
        for c in containers(objects)
        if any(v["name"] == MIG_MONITOR for v in c.get("env", []))
        and not holds_sys_admin(c.get("securityContext") or {})
    ]


MIG_STRATEGIES = [None, "none", "single", "mixed"]
LIST_STRATEGIES: list[Any] = [
    None,
    "envvar",
    "volume-mounts",
    "cdi-annotations",
    "cdi-cri",
    ["envvar", "volume-mounts"],
    "cdi-cri,volume-mounts",
]
CONTEXTS: dict[str, dict[str, Any]] = {
    "chart's": {},
    "compatWithCPUManager": {"compatWithCPUManager": True},
    "given, no SYS_ADMIN": {"securityContext": {"capabilities": {"drop": ["ALL"]}}},
    "given, SYS_ADMIN": {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
}


def test_no_rendering_sets_mig_monitor_devices_without_cap_sys_admin() -> None:
    """Every migStrategy x deviceListStrategy x security context: a container with the
    variable holds CAP_SYS_ADMIN, and with the chart's own context the variable (and
    SYS_ADMIN) are there exactly when MIG may be in use or devices are volume-mounted."""
    failures = []
    cases = [(m, s, "chart's") for m, s in itertools.product(MIG_STRATEGIES, LIST_STRATEGIES)]
    cases += itertools.product(MIG_STRATEGIES, [None, "volume-mounts"], list(CONTEXTS)[1:])
    for mig, lists, label in cases:
        context = CONTEXTS[label]
        values = {"migStrategy": mig, "deviceListStrategy": lists, **context}
        objects = objects_of(render(values))
        where = f"migStrategy={mig} deviceListStrategy={lists} context={label}"
        if refused_by_the_runtime(objects):
            failures.append(f"{where}: {MIG_MONITOR} without CAP_SYS_ADMIN")
        wanted = mig in ("single", "mixed") or "volume-mounts" in str(lists)
        has_var = MIG_MONITOR in env(objects)
        if label != "given, no SYS_ADMIN" and has_var is not wanted:
            failures.append(f"{where}: {MIG_MONITOR} {'set' if has_var else 'missing'}")
        if label == "chart's":
            added = (container(objects)["securityContext"]["capabilities"]).get("add", [])
            if ("SYS_ADMIN" in added) is not wanted:
                failures.append(f"{where}: SYS_ADMIN {added}")
    assert not failures, "\n".join(failures)


def test_the_static_manifests_never_set_mig_monitor_devices_without_cap_sys_admin() -> None:
    objects = tuple(o for o in yaml.safe_load_all(MANIFESTS.read_text()) if o)
    assert containers(objects)
    assert refused_by_the_runtime(objects) == []


def test_the_checker_spots_the_container_the_runtime_refuses() -> None:
    bad = {"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [
        {"name": "agent", "env": [{"name": MIG_MONITOR, "value": "all"}],
         "securityContext": {"capabilities": {"drop": ["ALL"]}}}]}}}}  # fmt: skip
    assert refused_by_the_runtime((bad,)) == ["agent"]


def test_the_test_data_is_nvidias_file_unchanged() -> None:
    assert hashlib.sha256(NVIDIA_VALUES_FILE.read_bytes()).hexdigest() == NVIDIA_SHA256


def test_nvidias_values_file_installs_unchanged() -> None:
    """`helm install -f values.yaml` with NVIDIA's own file: schema, lint and every object
    valid on every Kubernetes version."""
    report = helm.lint(str(CHART), NVIDIA_VALUES, strict=True, namespace="gpu-system")
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]
    objects = rendered("nvidia-v020")
    errors = [e for v in kube_versions() for o in objects for e in schema_errors(o, v)]
    assert not errors, "\n".join(errors)
    assert refused_by_the_runtime(objects) == []
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    # NVIDIA's affinity list replaces ours whole, and NVIDIA's chart selects Tegra nodes
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert (
        terms
        == NVIDIA_VALUES["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
    )


def edited(**changes: Any) -> dict[str, Any]:
    values = copy.deepcopy(NVIDIA_VALUES)
    values.update(changes)
    return values


def test_compat_with_cpu_manager_runs_privileged_passing_device_specs() -> None:
    objects = objects_of(render(edited(compatWithCPUManager=True, migStrategy="mixed")))
    agent = container(objects)
    assert agent["securityContext"] == {"privileged": True}
    variables = env(objects)
    assert variables["PASS_DEVICE_SPECS"] == "true"
    assert variables[MIG_MONITOR] == "all"
    flags = resolve(Config(), {}, {k: v for k, v in variables.items() if isinstance(v, str)})
    assert flags.flags.plugin.pass_device_specs is True
    assert flags.flags.mig_strategy == "mixed"


def test_security_contexts_given_replace_the_charts() -> None:
    pod_context = {"runAsUser": 0, "fsGroup": 0}
    context = {"privileged": True}
    objects = objects_of(render(edited(securityContext=context, podSecurityContext=pod_context)))
    assert container(objects)["securityContext"] == context
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"] == pod_context


def test_namespace_override_and_selector_labels_override() -> None:
    values = edited(namespaceOverride="gpu-agents", selectorLabelsOverride={"app": "gpu-agent"})
    objects = objects_of(render(values))
    namespaced = [o for o in objects if o["kind"] not in {"ClusterRole", "ClusterRoleBinding"}]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"gpu-agents"}
    subjects = the(objects, "ClusterRoleBinding")["subjects"]
    assert subjects[0]["namespace"] == "gpu-agents"
    daemonset = the(objects, "DaemonSet")
    assert daemonset["spec"]["selector"] == {"matchLabels": {"app": "gpu-agent"}}
    assert daemonset["spec"]["template"]["metadata"]["labels"]["app"] == "gpu-agent"


def test_the_default_namespace_is_refused_unless_allowed() -> None:
    with pytest.raises(helm.HelmError, match="allowDefaultNamespace=true"):
        render(edited(), namespace="default")
    assert render(edited(allowDefaultNamespace=True), namespace="default")
    with pytest.raises(helm.HelmError, match="allowDefaultNamespace=true"):
        render(edited(namespaceOverride="default"))


def test_nvidias_flag_values_reach_the_agent() -> None:
    values = edited(
        nvidiaDevRoot="/",
        gdrcopyEnabled=True,
        gdsEnabled=False,
        mofedEnabled=True,
        deviceDiscoveryStrategy="nvml",
        cdi={"nvidiaHookPath": "/usr/local/nvidia/toolkit/nvidia-cdi-hook", "featureFlags": ["x"]},
        deviceListStrategy=["cdi-annotations", "cdi-cri"],
    )
    variables = {k: v for k, v in env(objects_of(render(values))).items() if isinstance(v, str)}
    flags = resolve(Config(), {}, variables).flags
    assert flags.nvidia_dev_root == "/"
    assert (flags.gdrcopy_enabled, flags.gds_enabled, flags.mofed_enabled) == (True, False, True)
    assert flags.device_discovery_strategy == "nvml"
    assert flags.plugin.nvidia_ctk_path == "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    assert check_settings({}, variables)["cdi-feature-flags"] == ("x",)


def test_nvidia_only_values_are_accepted_and_notes_say_what_gpuslice_does() -> None:
    defaults = notes_of(render(edited()))
    # NVIDIA's defaults name gfd and nfd: the notes say they are ignored, not devicePlugin
    assert "gfd.* (NVIDIA's GPU Feature Discovery DaemonSet) is ignored" in defaults
    assert "nfd.* (NVIDIA's Node Feature Discovery subchart) is ignored" in defaults
    assert "devicePlugin.enabled=false" not in defaults
    off = edited(devicePlugin={"enabled": False}, gfd={"enabled": True})
    assert "gpuslice's agent is the device plugin, and it was installed" in notes_of(render(off))
    ours = notes_of(render({}))
    assert "ignored" not in ours


def test_a_realistic_migration_renders_with_the_users_edits() -> None:
    """NVIDIA's file with what a user typically changed in it."""
    values = edited(
        migStrategy="mixed",
        failOnInitError=False,
        nodeSelector={"nvidia.com/gpu.deploy.device-plugin": "true"},
        config={
            "map": {"default": "version: v1\n", "ts": "version: v1\nsharing:\n  timeSlicing:\n"
                    "    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n"},
            "default": "default",
        },
        tolerations=[{"key": "gpu", "operator": "Exists"}],
        resources={"limits": {"memory": "512Mi"}},
        runtimeClassName="nvidia",
        gfd={**NVIDIA_VALUES["gfd"], "enabled": True},
    )  # fmt: skip
    objects = objects_of(render(values))
    errors = [e for o in objects for e in schema_errors(o, "1.30")]
    assert not errors, errors
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.device-plugin": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert refused_by_the_runtime(objects) == []
    assert any(is_hook(o) and o["kind"] == "Job" for o in objects)


# --- node selection ---------------------------------------------------------------------


GPU_NODE = {
    "kubernetes.io/hostname": "gpu-1",
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "Tesla-T4",
}
TEGRA_NODE = {
    "kubernetes.io/hostname": "jetson-1",
    "feature.node.kubernetes.io/cpu-model.vendor_id": "NVIDIA",
}


def nfd_pruned(labels: dict[str, str]) -> dict[str, str]:
    """The labels left once NFD's post-delete cleanup removed every label it managed: its
    own and those published through it (GFD's nvidia.com/ ones)."""
    return {
        k: v
        for k, v in labels.items()
        if not k.startswith(("feature.node.kubernetes.io/", "nvidia.com/"))
    }


def test_the_default_affinity_survives_nfd_pruning_its_labels() -> None:
    affinity = the(rendered("defaults"), "DaemonSet")["spec"]["template"]["spec"]["affinity"]
    assert selects(affinity, GPU_NODE)
    assert not selects(affinity, nfd_pruned(GPU_NODE))  # why migrate.md step 4 warns
    labelled = {**GPU_NODE, "gpuslice.io/gpu-node": "true"}
    assert selects(affinity, nfd_pruned(labelled))
    assert not selects(affinity, {"kubernetes.io/hostname": "cpu-1"})


def test_tegra_nodes_are_left_out_of_the_default_selection() -> None:
    affinity = the(rendered("defaults"), "DaemonSet")["spec"]["template"]["spec"]["affinity"]
    assert not selects(affinity, TEGRA_NODE)
    nvidia = the(rendered("nvidia-v020"), "DaemonSet")["spec"]["template"]["spec"]["affinity"]
    assert selects(nvidia, TEGRA_NODE)  # NVIDIA's own list does (docs/migrate.md)


def _leaves(values: dict[str, Any], prefix: str = "") -> set[str]:
    free = {"config.map", "affinity", "nodeSelector", "resources", "podAnnotations"}
    out: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in free:
            out |= _leaves(value, f"{path}.")
        else:
            out.add(path)
    return out


def test_migrate_md_maps_every_nvidia_value() -> None:
    doc = (CHART.parents[2] / "docs" / "migrate.md").read_text()
    section = doc.split("## NVIDIA's chart values", 1)[1].split("\n## ", 1)[0]
    named = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            named |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    missing = [
        leaf
        for leaf in sorted(_leaves(NVIDIA_VALUES))
        if leaf not in named and f"{leaf.split('.')[0]}.*" not in named
    ]
    assert not missing, f"migrate.md's table lacks {missing}"
