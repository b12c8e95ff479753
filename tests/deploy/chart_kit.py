"""Shared by the chart tests: the generator tool, the values matrix rendered once per set by
Helm's engine, and Kubernetes schema validators built once per version and kind."""

from __future__ import annotations

import importlib.util
import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import referencing
import yaml
from kubernetes_validate.utils import all_versions
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gen_chart.py"
CHART = ROOT / "deploy" / "helm" / "gpuslice"
MANIFESTS = ROOT / "deploy" / "manifests" / "gpuslice.yaml"
OLDEST_KUBE = Version("1.28")
POLICY_KUBE = Version("1.30")  # ValidatingAdmissionPolicy v1: rendered from this version on
DRA_KUBE = Version("1.34")  # resource.k8s.io/v1: DRA rendered from this version on
_API_VERSION = re.compile(r"^([^./]*)(?:\.[^/]*)?/")
RELEASE = "gpu"
NAMESPACE = "gpu-system"
CONFIGS = {
    "default": "version: v1\n",
    "t4-ts-4": (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    ),
}
ADMISSION_MPS = "version: v1\nsharing:\n  mps:\n    resources:\n    - {name: gpu, replicas: 2}\n"

# NVIDIA's chart's own values file (tests/deploy/data/README.md).
NVIDIA_VALUES_FILE = Path(__file__).parent / "data" / "nvidia-device-plugin-0.20.0-values.yaml"
NVIDIA_VALUES: dict[str, Any] = yaml.safe_load(NVIDIA_VALUES_FILE.read_text())

# Each set of non-default values is rendered, linted and validated.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "config-map": {"config": {"map": CONFIGS, "default": "t4-ts-4"}},
    "config-name": {"config": {"name": "my-configs", "fallbackStrategies": ["named", "empty"]}},
    "config-name-default": {"config": {"name": "my-configs", "default": "t4-ts-4"}},
    "config-map-mount": {"config": {"map": CONFIGS, "default": "t4-ts-4", "source": "mount"}},
    "config-name-mount": {"config": {"name": "my-configs", "source": "mount"}},
    "simulate": {"simulate": "t4x4", "affinity": None, "nodeSelector": {"gpuslice/sim": "yes"}},
    "runtime-class": {"runtimeClassName": "nvidia"},
    "driver-root": {"nvidiaDriverRoot": "/run/nvidia/driver"},
    "cdi-cri": {"deviceListStrategy": ["cdi-cri", "envvar"], "deviceIDStrategy": "index"},
    "mig-mixed": {"migStrategy": "mixed", "failOnInitError": False},
    "scheduling": {
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "on", "effect": "NoExecute"}],
        "nodeSelector": {"pool": "gpu"},
        "affinity": None,
        "priorityClassName": "system-cluster-critical",
    },
    "on-delete": {"updateStrategy": {"type": "OnDelete"}},
    "rolling-2": {
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}
    },
    "pull-secrets": {
        "image": {
            "repository": "registry.example/gpuslice",
            "tag": "1.2.3",
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"example.com/team": "ml"},
    },
    "labels-file": {"labels": {"output": "file", "featuresDir": "/etc/nfd/features.d"}},
    "labels-off": {"labels": {"output": "off"}, "log": {"level": "debug", "format": "json"}},
    "names": {"fullnameOverride": "gpu-agent", "statusPort": 9400, "resources": None},
    "monitoring": {
        "monitoring": {
            "service": {"enabled": True},
            "serviceMonitor": {"enabled": True, "interval": "15s"},
            "prometheusRule": {"enabled": True},
            "dashboard": {"enabled": True},
            "labels": {"release": "prom"},
        }
    },
    "accounting-off": {"accounting": {"enabled": False}},
    "memory-isolation": {"memoryIsolation": {"enabled": True}},
    "mig-manager": {"migManager": {"enabled": True, "config": "default-mig-parted-config"}},
    "memory-budget-terminate": {
        "memoryBudget": {
            "policy": "terminate",
            "budgets": {
                "nvidia.com/gpu": "4Gi",
                "nvidia.com/gpu.shared": "10Gi",
                "nvidia.com/mig-1g.5gb": "512M",
            },
        }
    },
    "mps": {"mps": {"enabled": True}, "config": {"map": {"mps-2": ADMISSION_MPS}}},
    "compat-cpu-manager": {"compatWithCPUManager": True, "migStrategy": "mixed"},
    "security-context": {
        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0},
        "podSecurityContext": {"runAsGroup": 0},
        "deviceListStrategy": "volume-mounts",
    },
    "host-network": {
        "hostNetwork": True,
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"}],
        "kubeletRootDir": "/var/lib/k0s/kubelet",
    },
    "metrics-policy": {
        "metrics": {"port": 9400, "bindAddress": "127.0.0.1", "networkPolicy": {"enabled": True}},
        "monitoring": {"serviceMonitor": {"enabled": True, "interval": "30s"}},
    },
    "nvidia-extras": {
        "namespaceOverride": "gpu-agents",
        "selectorLabelsOverride": {"app": "gpu-agent"},
        "gdrcopyEnabled": True,
        "deviceDiscoveryStrategy": "nvml",
        "nvidiaDevRoot": "/",
        "cdi": {"nvidiaHookPath": "/usr/local/bin/nvidia-cdi-hook", "featureFlags": ["a", "b"]},
        "deviceListStrategy": "cdi-cri",
    },
    "nvidia-v020": NVIDIA_VALUES,
    "dra": {
        "dra": {
            "enabled": True,
            "devicePluginResources": ["nvidia.com/gpu"],
            "consumableShares": True,
        },
        "kubeletRootDir": "/var/lib/k0s/kubelet",
    },
    "admission": {
        "config": {"map": {**CONFIGS, "mps-2": ADMISSION_MPS}, "default": "t4-ts-4"},
        "admissionPolicies": {"enabled": True, "warn": ["nvidia.com/gpu.small"]},
    },
}


def load_tool(path: Path = TOOL) -> ModuleType:
    """A script of tools/ loaded as a module (gen_chart.py by default)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def tool() -> ModuleType:
    return load_tool()


@cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    """The objects the chart renders for one value set (each set is rendered once)."""
    gen = tool()
    out = gen.render(CHART, VALUE_SETS[name], release=RELEASE, namespace=NAMESPACE)
    return tuple(gen.objects(out))


HOOK = "helm.sh/hook"


def is_hook(obj: dict[str, Any]) -> bool:
    return HOOK in (obj["metadata"].get("annotations") or {})


def is_mps_control(obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return bool(labels.get("app.kubernetes.io/component") == "mps-control")


def is_metrics_reader(obj: dict[str, Any]) -> bool:
    """The ClusterRole (and binding) that scrapers get with metrics.auth kubernetes."""
    return str(obj["metadata"]["name"]).endswith("-metrics-reader")


def the(
    objects: tuple[dict[str, Any], ...],
    kind: str,
    namespace: str | None = None,
    *,
    mps_control: bool = False,
    metrics_reader: bool = False,
) -> Any:
    """The one object of `kind` (in `namespace`) that the release installs, hooks aside:
    the agent's, or with `mps_control` the mps-control DaemonSet's (mps.enabled), or with
    `metrics_reader` the scrapers' ClusterRole or its binding."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and not is_hook(o)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
        and is_mps_control(o) is mps_control
        and is_metrics_reader(o) is metrics_reader
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(objects: tuple[dict[str, Any], ...]) -> Any:
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def env(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """The container's env: literal values as text, downward-API ones as their fieldRef."""
    out: dict[str, Any] = {}
    for var in container(objects)["env"]:
        assert var["name"] not in out, f"{var['name']} set twice"
        out[var["name"]] = var.get("value", var.get("valueFrom"))
    return out


def kube_versions() -> list[str]:
    """Every Kubernetes minor version kubernetes-validate knows, from OLDEST_KUBE on."""
    found = {Version(v) for v in all_versions()}
    return [f"{v.major}.{v.minor}" for v in sorted(found) if v >= OLDEST_KUBE]


@cache
def _definitions(version: str) -> referencing.Resource[Any]:
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    text = (folder / f"v{version}.0-local-strict" / "_definitions.json").read_text()
    return referencing.Resource.from_contents(json.loads(text))


@cache
def validator(version: str, api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """The strict schema of one kind at one Kubernetes version, as kubernetes-validate
    builds it, compiled once."""
    # kubernetes-validate's file naming: rbac.authorization.k8s.io/v1 -> rbac-v1
    name = kind.lower() + "-" + _API_VERSION.sub(r"\1-", api_version)
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    schema = json.loads((folder / f"v{version}.0-local-strict" / f"{name}.json").read_text())
    registry: referencing.Registry[Any] = (
        referencing.Resource.from_contents(schema) @ referencing.Registry()
    )
    registry = _definitions(version) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


# Prometheus Operator's CRDs: kubernetes-validate has schemas of built-in kinds only, so these
# are skipped here and their shape is checked by test_chart_monitoring.py. Any other kind
# without a schema still fails.
NO_SCHEMA = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


def schema_errors(obj: dict[str, Any], version: str) -> list[str]:
    """One line per place where `obj` breaks its kind's schema at `version` (none for the
    kinds of NO_SCHEMA)."""
    if (obj["apiVersion"], obj["kind"]) in NO_SCHEMA:
        return []
    check = validator(version, obj["apiVersion"], obj["kind"])
    where = f"{obj['kind']}/{obj['metadata']['name']} on {version}"
    return [
        f"{where}: {'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in check.iter_errors(obj)
    ]


# The scheduler's host-port rule, as Kubernetes applies it to a DaemonSet's surge pod:
# 1. On create, the API server defaults a hostNetwork pod's ports: every declared
#    containerPort without a hostPort gets hostPort = containerPort (init containers too).
# 2. The scheduler's NodePorts filter then refuses a node where a pod already running there
#    uses one of the new pod's host ports: same protocol (TCP when unset) and number, and
#    host IPs that overlap (equal, or either one unset / 0.0.0.0, meaning every address).
HostPort = tuple[str, str, int]  # host IP, protocol, port


def host_ports(pod_spec: dict[str, Any]) -> set[HostPort]:
    """The host ports a pod of this spec holds on its node once the API server defaulted it."""
    held: set[HostPort] = set()
    for box in [*pod_spec.get("initContainers", ()), *pod_spec["containers"]]:
        for port in box.get("ports", ()):
            number = port.get("hostPort") or (
                port["containerPort"] if pod_spec.get("hostNetwork") else 0
            )
            if number:
                ip = port.get("hostIP") or "0.0.0.0"
                held.add((ip, port.get("protocol") or "TCP", int(number)))
    return held


def host_port_conflicts(running: dict[str, Any], incoming: dict[str, Any]) -> set[HostPort]:
    """The host ports of `incoming` that a pod of `running` on the same node blocks: any one
    keeps the scheduler from placing `incoming` there."""
    every = "0.0.0.0"
    return {
        (ip, protocol, number)
        for ip, protocol, number in host_ports(incoming)
        for other_ip, other_protocol, other_number in host_ports(running)
        if protocol == other_protocol
        and number == other_number
        and (every in (ip, other_ip) or ip == other_ip)
    }
