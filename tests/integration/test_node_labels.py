"""The labeller beside the plugin in node mode: the features file (FeatureFile sink) and the
NodeFeature object (MemoryNodeApi) come to hold the labels of the config in force after each
switch (published in the background), an unchanged relabel writes nothing, and stopping
removes the file as GFD does."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from agent_harness import GPU, serving
from node_harness import CONFIGS, SHARED, WITHIN_S, NodeLauncher, RunningNode, file_labels

from gpuslice.core.labels import TIMESTAMP_LABEL
from gpuslice.testing.kubelet import KubeletStandin

PRODUCT = "nvidia.com/gpu.product"
REPLICAS = "nvidia.com/gpu.replicas"
COUNT = "nvidia.com/gpu.count"
STRATEGY = "nvidia.com/gpu.sharing-strategy"
GOLDEN = Path(__file__).resolve().parents[1] / "unit" / "core" / "golden"

Read = Callable[[], "dict[str, str] | None"]


@pytest.fixture
async def nodes(plugin_dir: str, tmp_path: Path) -> AsyncIterator[NodeLauncher]:
    async with NodeLauncher(plugin_dir, tmp_path) as launcher:
        yield launcher


def _golden(case: str) -> dict[str, str]:
    lines = (GOLDEN / f"{case}.labels").read_text(encoding="utf-8").splitlines()
    pairs = (line.split("=", 1) for line in lines)
    return {k: v for k, v in pairs if k != TIMESTAMP_LABEL}


async def _start(nodes: NodeLauncher, sink: str, tmp_path: Path) -> tuple[RunningNode, Read]:
    """A Node publishing to a features file or to the NodeFeature object, with its reader."""
    if sink == "features-file":
        path = tmp_path / "features.d" / "gfd"
        flags = {"labels": "true", "use-node-feature-api": "false", "output-file": str(path)}
        running = await nodes.start(flags=flags)
        return running, lambda: file_labels(path)
    running = await nodes.start()  # labels auto: on, since there is a Node API
    return running, running.node_feature


def _core(labels: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if k in (PRODUCT, COUNT, REPLICAS, STRATEGY)}


SINKS = ["features-file", "node-feature"]


@pytest.mark.parametrize("sink", SINKS)
async def test_the_labels_follow_every_config_switch(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, sink: str
) -> None:
    running, read = await _start(nodes, sink, tmp_path)
    assert running.sink is not None
    await running.sink.wait_published()
    first = read()
    assert first is not None
    assert {k: v for k, v in first.items() if k != TIMESTAMP_LABEL} == _golden("t4x4-time-slicing")
    assert first[TIMESTAMP_LABEL].isdigit()

    steps: list[tuple[str | None, dict[str, str]]] = [
        ("ts-8", {PRODUCT: "Tesla-T4-SHARED", COUNT: "4", REPLICAS: "8", STRATEGY: "time-slicing"}),
        ("shared-4", {PRODUCT: "Tesla-T4", COUNT: "4", REPLICAS: "4", STRATEGY: "time-slicing"}),
        ("h100-mps", {PRODUCT: "Tesla-T4", COUNT: "4", REPLICAS: "4", STRATEGY: "time-slicing"}),
        (None, {PRODUCT: "Tesla-T4-SHARED", COUNT: "4", REPLICAS: "4", STRATEGY: "time-slicing"}),
    ]
    labeller = running.node.labeller
    assert labeller is not None
    for label, expected in steps:
        seen = running.manager.checks
        running.set_label(label)
        await running.checked(seen, lambda: True)

        # Labels follow in the background, after the config is in force.
        def published(want: dict[str, str] = expected) -> bool:
            return _core(read()) == want

        await asyncio.wait_for(labeller.wait_for(published), WITHIN_S)
    assert running.manager.status.config == "ts-4"  # h100-mps was rejected on the way
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), WITHIN_S)


async def test_the_labels_follow_a_configmap_edit(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path
) -> None:
    running, read = await _start(nodes, "node-feature", tmp_path)
    assert running.sink is not None
    await running.sink.wait_published()
    seen = running.manager.checks
    running.update_configmap({**CONFIGS, "ts-4": CONFIGS["ts-8"]})
    await running.checked(seen, lambda: running.served == {GPU: 32})
    assert running.node.labeller is not None
    replicas_8 = running.node.labeller.wait_for(lambda: _core(read()).get(REPLICAS) == "8")
    await asyncio.wait_for(replicas_8, WITHIN_S)


async def test_an_unchanged_relabel_or_reload_writes_nothing(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path
) -> None:
    running, read = await _start(nodes, "node-feature", tmp_path)
    assert running.sink is not None
    assert running.node.labeller is not None
    await running.sink.wait_published()
    writes, stored = running.api.writes, read()
    assert writes == 1

    assert await running.node.labeller.relabel() is False
    seen = running.manager.checks
    running.reload.set()  # SIGHUP with nothing new
    await running.checked(seen, lambda: True)
    assert running.api.writes == writes
    assert read() == stored  # the timestamp did not move either


async def test_an_unchanged_relabel_leaves_the_features_file_alone(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path
) -> None:
    running, _ = await _start(nodes, "features-file", tmp_path)
    assert running.sink is not None
    assert running.node.labeller is not None
    await running.sink.wait_published()
    path = tmp_path / "features.d" / "gfd"
    before = os.stat(path)
    assert await running.node.labeller.relabel() is False
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert [n for n in os.listdir(path.parent) if n != "gfd"] == []  # no temporary left


@pytest.mark.parametrize(("sink", "kept"), [("features-file", False), ("node-feature", True)])
async def test_stopping_removes_the_features_file_and_keeps_the_node_feature(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path, sink: str, kept: bool
) -> None:
    """As GFD: the file's labels vanish with the agent; the object is left to its owners."""
    running, read = await _start(nodes, sink, tmp_path)
    assert running.sink is not None
    await running.sink.wait_published()
    assert read() is not None
    await running.shutdown()
    assert (read() is not None) == kept


async def test_renamed_resource_keeps_the_original_label_group(
    kubelet: KubeletStandin, nodes: NodeLauncher, tmp_path: Path
) -> None:
    """Under renameByDefault the labels stay keyed by nvidia.com/gpu, without -SHARED."""
    running, read = await _start(nodes, "node-feature", tmp_path)
    seen = running.manager.checks
    running.set_label("shared-4")
    await running.checked(seen, lambda: running.manager.status.config == "shared-4")
    await kubelet.wait_for(lambda k: serving(k, {SHARED: 16}), WITHIN_S)
    assert running.node.labeller is not None
    await running.node.labeller.wait_for(lambda: _core(read()).get(PRODUCT) == "Tesla-T4")
    labels = read()
    assert labels is not None
    assert labels[PRODUCT] == "Tesla-T4"
    assert not any(k.startswith("nvidia.com/gpu.shared.") for k in labels)
