"""How the chart hands the per-node configs to the agent, checked against the agent's own
wiring: with `config.source: api` (the default) the agent is told the ConfigMap's name and
reads it through the API, nothing is mounted, and `config.default` lives in the chart-made
ConfigMap's annotation, so a `helm upgrade --set config.default=X` changes that ConfigMap
alone and the running agent applies it; with `mount` the ConfigMap is a volume, as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml
from chart_kit import CHART, CONFIGS, NAMESPACE, RELEASE, VALUE_SETS, container, env, rendered, the
from chart_kit import tool as chart_tool

from gpuslice.config.options import RunOptions, resolve_options
from gpuslice.services.config_source import (
    DEFAULT_ANNOTATION,
    ConfigMapEntries,
    DirectoryEntries,
)
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.host import host
from gpuslice.wiring.node import config_entries, node_config

NODE = "gpu-node-1"
CHART_MAP = f"{RELEASE}-gpuslice-configs"  # the ConfigMap the chart makes from config.map
# Where the agent reads its configs from, per value set; every other set has none.
SOURCES: dict[str, tuple[type, str]] = {
    "config-map": (ConfigMapEntries, f"ConfigMap {NAMESPACE}/{CHART_MAP}"),
    "admission": (ConfigMapEntries, f"ConfigMap {NAMESPACE}/{CHART_MAP}"),
    "mps": (ConfigMapEntries, f"ConfigMap {NAMESPACE}/{CHART_MAP}"),
    "config-name": (ConfigMapEntries, f"ConfigMap {NAMESPACE}/my-configs"),
    "config-name-default": (ConfigMapEntries, f"ConfigMap {NAMESPACE}/my-configs"),
    "config-map-mount": (DirectoryEntries, "/available-configs"),
    "config-name-mount": (DirectoryEntries, "/available-configs"),
}
DOWNWARD = {"spec.nodeName": NODE, "metadata.namespace": NAMESPACE, "metadata.name": "gpu-x7k2p"}


def agent_env(objects: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The container's env as the agent sees it on NODE: downward-API fields filled in,
    and the API server's address the kubelet gives every container."""
    out = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    for name, value in env(objects).items():
        out[name] = value if isinstance(value, str) else DOWNWARD[value["fieldRef"]["fieldPath"]]
    return out


def agent_options(objects: tuple[dict[str, Any], ...]) -> RunOptions:
    return resolve_options(env=agent_env(objects), fake_hardware="t4x4")


def render(config: dict[str, Any]) -> dict[str, str]:
    gen = chart_tool()
    return dict(gen.render(CHART, {"config": config}, release=RELEASE, namespace=NAMESPACE))


def configmap_of(text: dict[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(text["gpuslice/templates/configmap.yaml"])
    return found


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_agent_reads_the_configs_from_where_the_chart_puts_them(name: str) -> None:
    objects = rendered(name)
    source = config_entries(agent_options(objects), MemoryNodeApi())
    if name not in SOURCES:
        assert source is None
        return
    kind, where = SOURCES[name]
    assert isinstance(source, kind)
    assert source.where == where
    pod = the(objects, "DaemonSet")["spec"]["template"]["spec"]
    volumes = [v for v in pod["volumes"] if "configMap" in v]
    if kind is ConfigMapEntries:
        assert not volumes  # nothing mounted: the API is the source
        assert not [m for m in container(objects)["volumeMounts"] if m["name"] == "configs"]
    else:
        mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "configs")
        assert mount["mountPath"] == where
        assert [v["name"] for v in volumes] == ["configs"]


def test_api_is_the_default_source_and_needs_no_restart_trigger() -> None:
    objects = rendered("config-map")
    variables = agent_env(objects)
    assert variables["CONFIG_MAP"] == CHART_MAP == the(objects, "ConfigMap")["metadata"]["name"]
    assert "CONFIG_FILE_SRCDIR" not in variables
    assert "DEFAULT_CONFIG" not in variables  # it would win over the annotation
    template = the(objects, "DaemonSet")["spec"]["template"]["metadata"]
    assert "annotations" not in template  # no checksum of the ConfigMap
    role = the(objects, "Role", NAMESPACE)  # where NAMESPACE (the ConfigMap's) points
    configmaps = [r for r in role["rules"] if "configmaps" in r["resources"]]
    assert configmaps == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get", "watch"],
            "resourceNames": [CHART_MAP],  # that ConfigMap only
        }
    ]


def test_config_default_is_written_into_the_chart_made_configmaps_annotation() -> None:
    configmap = the(rendered("config-map"), "ConfigMap")
    assert configmap["metadata"]["annotations"] == {DEFAULT_ANNOTATION: "t4-ts-4"}
    without = configmap_of(render({"map": CONFIGS}))
    assert "annotations" not in without["metadata"]


def test_a_new_default_or_edited_configs_change_the_configmap_and_nothing_else() -> None:
    """`helm upgrade --set config.default=X` (and new config.map text): every rendered
    object but the ConfigMap is byte for byte the same, so no pod is rolled."""
    before = render({"map": CONFIGS, "default": "t4-ts-4"})
    edited = {**CONFIGS, "t4-ts-4": CONFIGS["t4-ts-4"].replace("replicas: 4", "replicas: 8")}
    after = render({"map": edited, "default": "default"})
    assert set(before) == set(after)
    changed = {path for path in before if before[path] != after[path]}
    # and the install-time check's copy of the configs, a hook outside the release
    assert changed == {
        "gpuslice/templates/configmap.yaml",
        "gpuslice/templates/validate-hook.yaml",
    }
    annotations = [configmap_of(t)["metadata"]["annotations"] for t in (before, after)]
    assert annotations == [{DEFAULT_ANNOTATION: "t4-ts-4"}, {DEFAULT_ANNOTATION: "default"}]


def test_with_source_mount_a_new_default_changes_the_pod_template() -> None:
    """Why api is the default: mounted, the default is DEFAULT_CONFIG in the pod template,
    and changing it rolls every pod."""
    before = render({"map": CONFIGS, "default": "t4-ts-4", "source": "mount"})
    after = render({"map": CONFIGS, "default": "default", "source": "mount"})
    assert before["gpuslice/templates/daemonset.yaml"] != after["gpuslice/templates/daemonset.yaml"]
    assert "annotations" not in configmap_of(before)["metadata"]
    objects = rendered("config-map-mount")
    assert agent_env(objects)["DEFAULT_CONFIG"] == "t4-ts-4"
    assert "CONFIG_MAP" not in agent_env(objects)


def test_an_existing_configmap_is_read_by_name_and_its_default_is_DEFAULT_CONFIG() -> None:
    """The chart cannot write into a ConfigMap it does not own: config.default is then
    DEFAULT_CONFIG (a change rolls the pods); without it, the ConfigMap's own annotation
    decides."""
    objects = rendered("config-name-default")
    assert not [o for o in objects if o["kind"] == "ConfigMap"]
    variables = agent_env(objects)
    assert (variables["CONFIG_MAP"], variables["DEFAULT_CONFIG"]) == ("my-configs", "t4-ts-4")
    assert "DEFAULT_CONFIG" not in agent_env(rendered("config-name"))


async def test_the_running_agent_follows_a_helm_upgrade_of_config_default() -> None:
    """The agent wired from the chart's env, on a cluster holding the chart's ConfigMap,
    serves the annotated default; the ConfigMap of a second render with another
    config.default switches it live."""
    first = render({"map": CONFIGS, "default": "t4-ts-4"})
    second = render({"map": CONFIGS, "default": "default"})
    api = MemoryNodeApi({NODE: {}})

    def install(text: dict[str, str]) -> None:
        meta = configmap_of(text)["metadata"]
        data = configmap_of(text)["data"]
        api.put_config_map(meta["namespace"], meta["name"], data, meta.get("annotations"))

    install(first)
    opts = agent_options(tuple(chart_tool().objects(first)))
    applied: asyncio.Queue[object] = asyncio.Queue()
    manager = node_config(opts, host(opts), api)[0](applied.put)
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        async with asyncio.timeout(5):
            await applied.get()
            assert manager.current is not None
            assert manager.current.source == f"ConfigMap {NAMESPACE}/{CHART_MAP}[t4-ts-4]"
            install(second)
            await applied.get()
            assert manager.current.source == f"ConfigMap {NAMESPACE}/{CHART_MAP}[default]"
    finally:
        stop.set()
        async with asyncio.timeout(5):
            await task


def test_notes_say_how_to_switch_the_default_for_each_source() -> None:
    import helm_python as helm

    def notes(config: dict[str, Any]) -> str:
        with helm.Chart.load(CHART) as loaded:
            out = loaded.render(
                {"config": config}, name=RELEASE, namespace=NAMESPACE, is_install=True
            )
        text = next(text for path, text in out.items() if path.endswith("NOTES.txt"))
        return " ".join(text.split())

    api = notes({"map": CONFIGS})
    assert "--reuse-values --set config.default=ENTRY" in api
    assert "no pod restart" in api
    named = notes({"name": "my-configs"})
    assert f"annotate configmap my-configs {DEFAULT_ANNOTATION}=ENTRY" in named
    mount = notes({"map": CONFIGS, "source": "mount"})
    assert "config.default=ENTRY" not in mount
