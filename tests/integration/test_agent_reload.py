"""Reload after the config file changed on disk (what SIGHUP does): an unchanged
resource name keeps its registration and gets a new list, a rename moves the
devices to a new resource and socket, a broken file keeps the last good config, and
so does a file emptied by a truncated write; each reload is one log line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_harness import (
    EXAMPLES,
    GPU,
    AgentLauncher,
    RunningAgent,
    is_socket,
    one_node_options,
    registrations,
    serving,
    write_file,
)
from conftest import Logged
from faults_harness import eventually
from node_harness import time_slicing

from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.node import build_node

SHARED = "nvidia.com/gpu.shared"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(time_slicing(4))
    return path


async def _started(kubelet: KubeletStandin, launcher: AgentLauncher, config: Path) -> RunningAgent:
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    assert running.served == {GPU: 16}
    return running


async def test_fewer_replicas_send_a_new_list_on_the_same_registration(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path
) -> None:
    running = await _started(kubelet, launcher, config)
    updates = kubelet.updates(GPU)

    write_file(config, time_slicing(2))
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}))
    assert kubelet.updates(GPU) == updates + 1
    assert registrations(kubelet) == {GPU: 1}
    assert {d.split("::")[1] for d in kubelet.devices(GPU)} == {"0", "1"}


async def test_reload_through_the_reload_event_applies_the_edited_file(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path
) -> None:
    """The event the SIGHUP handler sets runs the same reload."""
    running = await _started(kubelet, launcher, config)
    write_file(config, time_slicing(3))
    running.reload_event.set()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 12}))
    assert registrations(kubelet) == {GPU: 1}


async def test_a_new_list_strategy_applies_to_the_next_allocate_without_a_new_list(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path
) -> None:
    running = await _started(kubelet, launcher, config)
    updates = kubelet.updates(GPU)
    g0 = running.gpu_uuid(0)
    (before,) = await kubelet.allocate(GPU, [[f"{g0}::0"]])
    assert before.envs == {"NVIDIA_VISIBLE_DEVICES": g0}

    cdi = "flags:\n  plugin:\n    deviceListStrategy: cdi-cri\n"
    write_file(config, time_slicing(4).replace("sharing:", f"{cdi}sharing:"))
    assert await running.reload()
    (after,) = await kubelet.allocate(GPU, [[f"{g0}::0"]])
    assert after.cdi_devices == (f"k8s.device-plugin.nvidia.com/gpu={g0}",)
    assert after.envs == {}
    assert kubelet.updates(GPU) == updates
    assert registrations(kubelet) == {GPU: 1}


async def test_renaming_registers_the_new_resource_and_removes_the_old_socket(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path
) -> None:
    running = await _started(kubelet, launcher, config)
    write_file(config, time_slicing(4, rename=True))
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {SHARED: 16}) and k.endpoint(GPU) is None)
    assert running.served == {SHARED: 16}
    assert registrations(kubelet) == {GPU: 1, SHARED: 1}
    assert kubelet.endpoint(SHARED) == "nvidia-gpu.shared.sock"
    assert is_socket(running.socket("nvidia-gpu.shared.sock"))
    assert not is_socket(running.socket("nvidia-gpu.sock"))
    # As on a real node: the old resource's capacity stays until the kubelet
    # forgets it, but none of it can be allocated.
    assert kubelet.node_status().allocatable == {GPU: 0, SHARED: 16}
    await kubelet.admit("shared-pod", {"main": {SHARED: 1}})
    assert kubelet.stale_streams == []


@pytest.mark.parametrize(
    "broken",
    [
        time_slicing(1),  # replicas must be >= 2
        "version: v1\nsharing: [\n",  # not YAML
        "version: v2\n",  # unknown version
    ],
    ids=["one-replica", "not-yaml", "unknown-version"],
)
async def test_a_broken_config_keeps_the_last_good_one_serving(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path, broken: str
) -> None:
    running = await _started(kubelet, launcher, config)
    updates = kubelet.updates(GPU)

    write_file(config, broken)
    assert await running.reload() is False
    assert running.served == {GPU: 16}
    assert serving(kubelet, {GPU: 16})
    assert kubelet.updates(GPU) == updates
    (admitted,) = await kubelet.admit("still-served", {"main": {GPU: 1}})
    assert admitted.device_ids[0] in kubelet.devices(GPU)

    write_file(config, time_slicing(2))
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}))
    assert registrations(kubelet) == {GPU: 1}


async def test_reload_from_a_configmap_entry_keeps_the_named_entry(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """The config name chosen at start still selects the entry after a reload."""
    manifest = tmp_path / "configmap.yaml"
    text = (EXAMPLES / "time-slicing-configmap.yaml").read_text()
    manifest.write_text(text)
    running = await launcher.start("t4x4", config=manifest, config_name="tesla-t4")
    await running.registered(kubelet)
    assert running.served == {GPU: 16}
    write_file(manifest, text.replace("replicas: 4", "replicas: 2"))
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}))


async def test_a_refused_reload_of_one_config_file_is_an_event_and_a_readiness_detail(
    kubelet: KubeletStandin, plugin_dir: str, config: Path
) -> None:
    """`gpuslice run --config-file FILE` in a cluster: a SIGHUP that finds the file
    broken keeps the last good config, records a ConfigRejected Event on the Node
    and says so in /readyz's details; the next good reload clears the detail."""
    api = MemoryNodeApi({"node-1": {}})
    node = build_node(one_node_options(plugin_dir, config), api)
    stop, reload = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(node.run(stop, reload))
    try:
        await kubelet.wait_for(lambda k: serving(k, {GPU: 16}))
        assert "config" not in node.readiness()[1]

        write_file(config, "version: v1\nflags:\n  migStrategy: bogus\n")
        assert not await node.reload()
        (event,) = api.events
        assert (event.node, event.reason, event.type) == ("node-1", "ConfigRejected", "Warning")
        assert event.message.startswith("config rejected, keeping the last good one: ")
        assert "bogus" in event.message
        ready, details = node.readiness()
        assert ready  # still serving the last good config
        assert details["config"] == {"ok": False, "detail": event.message}
        assert serving(kubelet, {GPU: 16})

        write_file(config, time_slicing(2))
        assert await node.reload()
        await kubelet.wait_for(lambda k: serving(k, {GPU: 8}))
        assert "config" not in node.readiness()[1]
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


EMPTY = ["", "\n   \n", "# sharing:\n#   timeSlicing: ...\n"]


@pytest.mark.parametrize("empty", EMPTY, ids=["zero-bytes", "whitespace", "comments"])
async def test_an_emptied_config_file_keeps_the_last_good_one_until_version_v1(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path, empty: str
) -> None:
    """A file that had content and is empty on SIGHUP was most likely cut short while
    being written: serving it would drop all sharing (16 replicas to 4 GPUs). The last
    good config stays; `version: v1` alone asks for the defaults on purpose."""
    running = await _started(kubelet, launcher, config)
    updates = kubelet.updates(GPU)

    write_file(config, empty)
    assert await running.reload() is False
    assert running.served == {GPU: 16}
    assert kubelet.updates(GPU) == updates
    assert running.rejected == (
        f"config rejected, keeping the last good one: {config}: the config is empty (no "
        "content: zero bytes, whitespace or comments only), most likely a truncated write; "
        "write `version: v1` to serve the defaults on purpose"
    )

    write_file(config, "version: v1\n")
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}))
    assert running.rejected is None


async def test_an_empty_file_at_start_serves_the_defaults_and_may_stay_empty(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path
) -> None:
    """At start there is nothing to keep: an empty file means the defaults, and a reload
    that finds it still empty changes nothing; content later is served as usual."""
    write_file(config, "")
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    assert running.served == {GPU: 4}

    write_file(config, "# nothing yet\n")
    assert await running.reload()
    write_file(config, time_slicing(4))
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}))


async def test_an_emptied_file_on_sighup_is_an_event_and_a_readiness_detail(
    kubelet: KubeletStandin, plugin_dir: str, config: Path
) -> None:
    """Through the reload event SIGHUP sets, in a cluster: the ConfigRejected Event on the
    Node and /readyz's detail say the empty file was refused."""
    api = MemoryNodeApi({"node-1": {}})
    node = build_node(one_node_options(plugin_dir, config), api)
    stop, reload = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(node.run(stop, reload))
    try:
        await kubelet.wait_for(lambda k: serving(k, {GPU: 16}))
        write_file(config, "")
        reload.set()
        await eventually(lambda: bool(api.events), "the ConfigRejected Event")
        (event,) = api.events
        assert event.reason == "ConfigRejected"
        assert "the config is empty" in event.message
        assert node.readiness()[1]["config"] == {"ok": False, "detail": event.message}
        assert serving(kubelet, {GPU: 16})
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_reload_is_one_line_with_each_resource_before_and_after(
    kubelet: KubeletStandin, launcher: AgentLauncher, config: Path, logged: Logged
) -> None:
    running = await _started(kubelet, launcher, config)
    (started,) = [e for e in logged if e["event"] == "agent_started"]
    assert (started["config"], started["gpus"]) == (str(config), "4x Tesla T4")
    write_file(config, time_slicing(8))
    assert await running.reload()
    (applied,) = [e for e in logged if e["event"] == "config_applied"]
    assert applied["config"] == str(config)
    assert applied["changes"] == "nvidia.com/gpu 16 -> 32 devices"
