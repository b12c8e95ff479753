"""Per-node configs applied live against the kubelet stand-in: the node label and the
mounted ConfigMap choose the config; only what changed is touched; a broken config keeps
the last good one serving and says so (Event, readiness); a reload goes to the manager;
a change that races with start-up is served, not only reported; per-node mode without a
node name refuses to start."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import GPU, is_socket, registrations, serving, write_file
from click.testing import CliRunner
from conftest import Logged
from faults_harness import eventually
from node_harness import (
    CONFIGS,
    NODE,
    REJECTED,
    SHARED,
    WITHIN_S,
    GatedOpen,
    NodeLauncher,
    RunningNode,
    time_slicing,
)

from gpuslice import __version__, cli
from gpuslice.adapters.kube import objects
from gpuslice.config.options import resolve_options
from gpuslice.core.errors import BackendError, ConfigError
from gpuslice.core.ports import GpuBackend
from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.kubelet import KubeletStandin

BROKEN = "version: v1\nflags:\n  migStrategy: bogus\n"


@pytest.fixture
async def nodes(plugin_dir: str, tmp_path: Path) -> AsyncIterator[NodeLauncher]:
    async with NodeLauncher(plugin_dir, tmp_path) as launcher:
        yield launcher


async def _started(kubelet: KubeletStandin, nodes: NodeLauncher, **kw: object) -> RunningNode:
    running = await nodes.start(**kw)  # type: ignore[arg-type]
    await kubelet.wait_for(lambda k: serving(k, running.served))
    return running


async def test_without_a_label_the_default_config_is_served(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    running = await _started(kubelet, nodes)
    assert running.served == {GPU: 16}
    assert running.manager.status.as_dict() == {
        "config": "ts-4",
        "ok": True,
        "detail": "label nvidia.com/device-plugin.config unset; default config",
    }


async def test_a_label_set_before_start_chooses_the_first_config(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    """The Node is read before anything is served: no detour through the default."""
    running = await _started(kubelet, nodes, label="ts-8")
    assert running.served == {GPU: 32}
    assert registrations(kubelet) == {GPU: 1}
    assert kubelet.updates(GPU) == 1


async def test_flipping_the_label_sends_a_new_list_on_the_same_registration(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    running = await _started(kubelet, nodes)
    updates = kubelet.updates(GPU)

    started = time.monotonic()
    running.set_label("ts-8")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), WITHIN_S)
    print(f"label flip -> new list at the stand-in: {(time.monotonic() - started) * 1000:.0f} ms")
    assert registrations(kubelet) == {GPU: 1}
    assert kubelet.updates(GPU) == updates + 1
    assert kubelet.endpoint(GPU) == "nvidia-gpu.sock"
    assert {d.split("::")[1] for d in kubelet.devices(GPU)} == {str(i) for i in range(8)}

    running.set_label(None)  # back to the default
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}), WITHIN_S)
    assert registrations(kubelet) == {GPU: 1}
    assert kubelet.stale_streams == []


async def test_pods_keep_their_replicas_across_a_switch(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    running = await _started(kubelet, nodes)
    (admitted,) = await kubelet.admit("notebook", {"main": {GPU: 1}})
    running.set_label("ts-8")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), WITHIN_S)
    assert admitted.device_ids[0] in kubelet.devices(GPU)
    assert kubelet.node_status().free == {GPU: 31}


async def test_a_label_naming_a_renamed_config_registers_the_new_resource_and_drops_the_old(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    running = await _started(kubelet, nodes)
    running.set_label("shared-4")
    await kubelet.wait_for(lambda k: serving(k, {SHARED: 16}) and k.endpoint(GPU) is None)
    assert running.served == {SHARED: 16}
    assert registrations(kubelet) == {GPU: 1, SHARED: 1}
    plugin_dir = nodes.plugin_dir
    assert is_socket(os.path.join(plugin_dir, "nvidia-gpu.shared.sock"))
    assert not is_socket(os.path.join(plugin_dir, "nvidia-gpu.sock"))
    assert kubelet.node_status().allocatable == {GPU: 0, SHARED: 16}


async def test_editing_the_mounted_configmap_applies_the_new_contents(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    """The kubelet's `..data` swap of the config in force is picked up by itself."""
    running = await _started(kubelet, nodes)
    updates = kubelet.updates(GPU)

    started = time.monotonic()
    running.update_configmap({**CONFIGS, "ts-4": time_slicing(2)})
    await kubelet.wait_for(lambda k: serving(k, {GPU: 8}), WITHIN_S)
    print(
        f"ConfigMap edit -> new list at the stand-in: {(time.monotonic() - started) * 1000:.0f} ms"
    )
    assert registrations(kubelet) == {GPU: 1}
    assert kubelet.updates(GPU) == updates + 1

    running.update_configmap({**CONFIGS, "ts-4": time_slicing(4, rename=True)})
    await kubelet.wait_for(lambda k: serving(k, {SHARED: 16}) and k.endpoint(GPU) is None)
    assert registrations(kubelet) == {GPU: 1, SHARED: 1}


async def test_an_edit_of_another_entry_or_a_same_named_label_touches_nothing(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    running = await _started(kubelet, nodes)
    updates, writes = kubelet.updates(GPU), running.api.writes

    seen = running.manager.checks
    running.update_configmap({**CONFIGS, "ts-8": time_slicing(6)})
    await running.checked(seen, lambda: True)
    seen = running.manager.checks
    running.set_label("ts-4")  # the entry already in force, now named by the label
    await running.checked(seen, lambda: running.manager.status.detail.startswith("label "))

    assert kubelet.updates(GPU) == updates
    assert registrations(kubelet) == {GPU: 1}
    assert running.api.writes == writes
    assert running.served == {GPU: 16}


@pytest.mark.parametrize("how", ["label-names-a-missing-entry", "entry-edited-to-invalid"])
async def test_a_broken_config_keeps_the_old_one_serving_and_says_so(
    kubelet: KubeletStandin, nodes: NodeLauncher, how: str
) -> None:
    running = await _started(kubelet, nodes)
    updates = kubelet.updates(GPU)
    seen = running.manager.checks
    if how == "label-names-a-missing-entry":
        running.set_label("h100-mps")
        problem = 'specified config "h100-mps" does not exist'
    else:
        running.update_configmap({**CONFIGS, "ts-4": BROKEN})
        problem = 'flags.migStrategy: got "bogus"'
    await running.checked(seen, lambda: not running.manager.status.ok)

    assert running.served == {GPU: 16}
    assert serving(kubelet, {GPU: 16})
    assert kubelet.updates(GPU) == updates
    (event,) = running.api.events
    assert (event.node, event.reason, event.type) == (NODE, REJECTED, objects.EVENT_WARNING)
    assert event.message.startswith("config rejected, keeping ts-4: ")
    assert problem in event.message
    ready, details = running.node.readiness()
    assert ready  # still serving everything
    assert details["config"] == {"config": "ts-4", "ok": False, "detail": event.message}
    assert details["device-plugin"]["resources"] == {GPU: True}

    seen = running.manager.checks
    running.update_configmap({**CONFIGS, "h100-mps": time_slicing(8)})  # the fix
    await running.checked(seen, lambda: running.manager.status.ok)
    await kubelet.wait_for(lambda k: serving(k, running.served), WITHIN_S)
    assert running.node.readiness()[1]["config"]["ok"] is True
    assert len(running.api.events) == 1  # recorded once, not on every re-read
    assert registrations(kubelet) == {GPU: 1}


async def test_a_config_the_hardware_cannot_serve_is_rejected_live(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    """migStrategy single on MIG-enabled and disabled GPUs together: refused on apply."""
    configs = {"none": "version: v1\n", "single": "version: v1\nflags:\n  migStrategy: single\n"}
    running = await _started(
        kubelet, nodes, hardware="a100-40gb-mig-mixed", configs=configs, default="none"
    )
    before = running.served
    seen = running.manager.checks
    running.set_label("single")
    await running.checked(seen, lambda: not running.manager.status.ok)
    assert running.served == before
    assert "use migStrategy mixed" in running.api.events[0].message


async def test_a_reload_goes_to_the_manager_and_reads_what_no_watch_saw(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    """SIGHUP's event re-reads the label and the directory: an entry edited in place
    (inside `..data`, which neither inotify nor polling of the directory can see) applies."""
    running = await _started(kubelet, nodes)
    write_file(os.path.join(running.configs, "..data", "ts-4"), time_slicing(3))
    seen = running.manager.checks
    running.reload.set()
    await running.checked(seen, lambda: True)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 12}), WITHIN_S)
    assert registrations(kubelet) == {GPU: 1}
    assert running.manager.status.config == "ts-4"


async def test_a_label_flip_while_the_backend_opens_is_served_and_then_reported(
    kubelet: KubeletStandin, nodes: NodeLauncher, logged: Logged
) -> None:
    """The label flips to ts-8 while the GPU backend is still opening (NVML can take
    seconds). The kubelet must get ts-8's list and readiness name ts-8, reported only once
    it is served: before, the flip was logged and shown as applied at once while the agent
    went on to serve the config it had read before the open, and the kubelet kept the old
    list until the next change."""
    gate = GatedOpen("t4x4")
    running = await nodes.start(wait_ready=False, change=gate.install)
    await gate.wait_opening()
    reads = running.manager.checks
    running.set_label("ts-8")

    def flip_taken_in() -> bool:
        # Seen, and then either read (and, before the fix, "applied") or queued behind the
        # first config, which waits until the agent serves it.
        seen = any(e["event"] == "config_label_changed" and e["new"] == "ts-8" for e in logged)
        status = running.manager.status
        return seen and (running.manager.checks > reads or status.detail.startswith("applying"))

    await eventually(flip_taken_in, "the manager took in the label flip")
    assert not running.manager.status.ok  # nothing is served yet, so nothing is "applied"
    gate.released.set()

    await kubelet.wait_for(lambda k: serving(k, {GPU: 32}), 5.0)
    await running.checked(0, lambda: running.manager.status.config == "ts-8")
    ready, details = running.node.readiness()
    assert ready
    assert details["config"] == {
        "config": "ts-8",
        "ok": True,
        "detail": "label nvidia.com/device-plugin.config=ts-8",
    }
    assert running.served == {GPU: 32}
    assert registrations(kubelet) == {GPU: 1}
    applied = [e for e in logged if e["event"] == "config_applied"]
    assert [(e["config"], e["changes"]) for e in applied] == [
        ("ts-8", "nvidia.com/gpu 16 -> 32 devices")
    ]


async def test_the_start_and_each_switch_are_logged_in_one_line(
    kubelet: KubeletStandin, nodes: NodeLauncher, logged: Logged
) -> None:
    """Start: the version, the config in force (name, source, one-line summary), the GPUs
    found and what is served. A switch: per resource, before -> after."""
    running = await _started(kubelet, nodes)
    (started,) = [e for e in logged if e["event"] == "agent_started"]
    assert started["version"] == __version__
    assert started["config"] == "ts-4"
    assert started["source"].endswith("/ts-4")
    assert "nvidia.com/gpu: 4 replicas" in started["summary"]
    assert "\n" not in started["summary"]
    assert started["gpus"] == "4x Tesla T4"
    assert started["serving"] == "nvidia.com/gpu 16 devices"

    seen = running.manager.checks
    running.set_label("shared-4")
    await running.checked(seen, lambda: running.manager.status.config == "shared-4")
    (applied,) = [e for e in logged if e["event"] == "config_applied"]
    assert applied["config"] == "shared-4"
    assert applied["changes"] == (
        "nvidia.com/gpu removed (16 devices), nvidia.com/gpu.shared added with 16 devices"
    )


@pytest.mark.parametrize("empty", ["", "\n  \n", "# truncated\n", "---\n"])
async def test_an_entry_emptied_keeps_the_last_good_one_and_says_so(
    kubelet: KubeletStandin, nodes: NodeLauncher, empty: str
) -> None:
    """A config that had content and becomes empty is read as a truncated write: ts-4
    stays in force, with the Event and the readiness detail; `version: v1` alone is the
    deliberate empty config and is served (4 whole GPUs)."""
    running = await _started(kubelet, nodes)
    seen = running.manager.checks
    running.update_configmap({**CONFIGS, "ts-4": empty})
    await running.checked(seen, lambda: not running.manager.status.ok)
    assert running.served == {GPU: 16}
    (event,) = running.api.events
    assert event.reason == REJECTED
    assert event.message.startswith("config rejected, keeping ts-4: ")
    assert "the config is empty" in event.message
    assert "write `version: v1` to serve the defaults on purpose" in event.message
    assert running.node.readiness()[1]["config"] == {
        "config": "ts-4",
        "ok": False,
        "detail": event.message,
    }

    seen = running.manager.checks
    running.update_configmap({**CONFIGS, "ts-4": "version: v1\n"})
    await running.checked(seen, lambda: running.manager.status.ok)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}), WITHIN_S)


async def test_an_empty_entry_is_served_at_start(
    kubelet: KubeletStandin, nodes: NodeLauncher
) -> None:
    """At start there is nothing to keep: an empty entry means the defaults."""
    running = await _started(kubelet, nodes, configs={**CONFIGS, "blank": ""}, default="blank")
    assert running.served == {GPU: 4}
    assert running.manager.status.ok


def test_per_node_configs_without_a_node_name_refuse_to_start(tmp_path: Path) -> None:
    """Without NODE_NAME the label cannot be read, and every node would silently serve
    the default config: `gpuslice run` stops with one line naming the flag and env var."""
    write_configmap_volume(str(tmp_path), CONFIGS)
    with pytest.raises(ConfigError) as caught:  # where the options are resolved
        resolve_options({"config-file-srcdir": str(tmp_path)}, fake_hardware="t4")
    assert str(caught.value) == (
        f"--config-file-srcdir (CONFIG_FILE_SRCDIR) {tmp_path}: per-node configs need this "
        "node's name to read its label; set --node-name or NODE_NAME (usually from the "
        "downward API, fieldPath spec.nodeName), otherwise every node would serve the "
        "default config"
    )

    result = CliRunner().invoke(
        cli.main,
        ["run", "--fake-hardware", "t4", "--config-file", str(tmp_path), "--kubelet-socket", ""],
        env={"NODE_NAME": None, "CONFIG_FILE_SRCDIR": None},
    )
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert line.startswith(f"gpuslice: error: --config-file (CONFIG_FILE), a directory, {tmp_path}")
    assert "NODE_NAME" in line


async def test_without_a_backend_and_fail_on_init_error_false_configs_settle_and_readiness_names_it(
    kubelet: KubeletStandin, nodes: NodeLauncher, logged: Logged
) -> None:
    """failOnInitError=false and NVML absent: the agent advertises nothing and waits, as
    upstream does. The config manager must not wait forever on the first config (holding
    its lock, so that no later label or reload is read), and /readyz must name the missing
    backend, not a config "waiting until it is served"."""

    def no_nvml() -> GpuBackend:
        raise BackendError("NVML did not initialise (NVML Shared Library Not Found)")

    running = await nodes.start(
        flags={"fail-on-init-error": "false"},
        wait_ready=False,
        change=lambda chosen: dataclasses.replace(chosen, open_backend=no_nvml),
    )
    await asyncio.wait_for(running.manager.ready.wait(), 5)  # the first config settled
    ready, details = running.node.readiness()
    assert not ready
    assert details["backend"] == (
        "the GPU backend is not available: NVML did not initialise (NVML Shared Library Not Found)"
    )
    assert details["config"]["config"] == "ts-4"

    seen = running.manager.checks
    running.set_label("ts-8")  # read at once: the manager is not stuck holding its lock
    await running.checked(seen, lambda: running.manager.status.config == "ts-8")
    assert await running.node.reload()
    assert kubelet.registrations == []
    assert not running.task.done()
    assert any(e["event"] == "backend_unavailable_waiting" for e in logged)
