"""The whole node (Node, as `gpuslice run --config-file` wires it in a cluster) given a
hostile config on reload: the last good config serves, the ConfigRejected Event and
the readiness details say why in one line. Under a cdi-* strategy without the NVIDIA
Container Toolkit's spec, readiness says that too (and the node stays ready)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuslice.config.options import resolve_options
from gpuslice.services.node import Node
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.node import build_node

from .test_config_text import BAD_TAGS, BOMB, GOOD

GPU = "nvidia.com/gpu"
CDI = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: cdi-cri\n"


@pytest.fixture
def api() -> MemoryNodeApi:
    return MemoryNodeApi({"node-1": {}})


@pytest.fixture
def first_config() -> str:
    return GOOD


@pytest.fixture
async def node(
    plugin_dir: str, kubelet: KubeletStandin, api: MemoryNodeApi, tmp_path: Path, first_config: str
) -> AsyncIterator[Node]:
    config = tmp_path / "config.yaml"
    config.write_text(first_config)
    opts = resolve_options(
        {
            "kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"),
            "cdi-spec-dir": os.path.join(plugin_dir, "cdi"),
            "config-file": str(config),
            "node-name": "node-1",
            "labels": "false",
            "accounting": "false",
        },
        fake_hardware="t4",
    )
    one = build_node(opts, api)
    stop, reload = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(one.run(stop, reload))
    try:
        await one.agent.ready.wait()
        yield one
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("text", [BAD_TAGS["bool"], BOMB], ids=["bad-tag", "alias-bomb"])
async def test_a_hostile_reload_is_an_event_and_a_readiness_detail(
    node: Node, kubelet: KubeletStandin, api: MemoryNodeApi, tmp_path: Path, text: str
) -> None:
    await kubelet.wait_for(lambda k: k.serves({GPU: 4}))
    (tmp_path / "config.yaml").write_text(text)
    assert not await node.reload()
    (event,) = api.events
    assert event.reason == "ConfigRejected"
    assert "\n" not in event.message
    assert event.message.startswith("config rejected, keeping the last good one: ")
    ready, details = node.readiness()
    assert ready
    assert details["config"] == {"ok": False, "detail": event.message}
    assert kubelet.serves({GPU: 4})


@pytest.mark.parametrize("first_config", [CDI])
async def test_readiness_says_the_toolkits_cdi_spec_is_missing(
    node: Node, kubelet: KubeletStandin, plugin_dir: str
) -> None:
    await kubelet.wait_for(lambda k: k.serves({GPU: 1}))
    ready, details = node.readiness()
    assert ready
    assert details["cdi"]["ok"] is False
    assert details["cdi"]["detail"].startswith("no CDI spec of kind nvidia.com/gpu in ")
