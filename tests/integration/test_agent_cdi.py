"""The whole agent under cdi-cri and cdi-annotations: every CDI name that Allocate
returns through the kubelet stand-in resolves in the CDI spec on disk, and the spec
follows reloads (strategy, MIG layout, renames), ignores health and outlives the agent."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from agent_harness import EXAMPLES, GPU, AgentLauncher, RunningAgent, serving, write_file
from node_harness import time_slicing

from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.core.cdi import qualified_names
from gpuslice.core.response import ContainerAllocation
from gpuslice.testing.kubelet import KubeletStandin

SPEC = "k8s.device-plugin.nvidia.com-gpu.json"
KIND = "k8s.device-plugin.nvidia.com/gpu"
MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


def spec_on_disk(launcher: AgentLauncher, name: str = SPEC) -> dict[str, Any] | None:
    path = Path(launcher.cdi_spec_dir, name)
    if not path.exists():
        return None
    spec: dict[str, Any] = json.loads(path.read_text())
    _check_valid(spec)
    return spec


def stamp(launcher: AgentLauncher) -> tuple[int, int]:
    """Which file holds the GPU spec, and when it was written: a rewrite changes both."""
    st = os.stat(os.path.join(launcher.cdi_spec_dir, SPEC))
    return (st.st_ino, st.st_mtime_ns)


def _check_valid(spec: dict[str, Any]) -> None:
    """The parts of CDI's own validation that a generated spec could break."""
    assert spec["cdiVersion"] in _VERSIONS
    vendor, cls = spec["kind"].split("/")
    assert vendor
    assert cls
    assert spec["devices"]
    for device in spec["devices"]:
        assert _NAME.fullmatch(device["name"]), device["name"]
        if not device["name"][0].isalpha():
            assert spec["cdiVersion"] >= "0.5.0"
        edits = device["containerEdits"]
        assert edits, f"{device['name']}: empty edits are invalid"
        assert all(n["path"].startswith("/dev/") for n in edits.get("deviceNodes", []))


def cdi_names(allocation: ContainerAllocation) -> set[str]:
    """The CDI names of one container's answer, from either strategy's field."""
    annotated = [n for value in allocation.annotations.values() for n in value.split(",")]
    return {*allocation.cdi_devices, *annotated}


async def every_answer(kubelet: KubeletStandin, running: RunningAgent) -> set[str]:
    """The CDI names of Allocate for each device alone, and of a pod admitted with every
    device of each resource (the kubelet's own path: preferred allocation, Allocate)."""
    names: set[str] = set()
    for resource, count in running.served.items():
        devices = sorted(kubelet.devices(resource))
        for answer in await kubelet.allocate(resource, [[d] for d in devices]):
            assert cdi_names(answer), answer
            names |= cdi_names(answer)
        pod = f"all-{resource.replace('/', '-')}"
        for admitted in await kubelet.admit(pod, {"main": {resource: count}}):
            names |= cdi_names(admitted.allocation)
        await kubelet.release(pod)
    return names


PROFILES: dict[str, tuple[str, str | None, str | None]] = {
    # name: (hardware, config text or example file, ConfigMap entry)
    "whole GPUs": ("t4x4", None, None),
    "time-sliced": ("t4x4", "time-slicing.yaml", None),
    "MIG mixed": ("a100-40gb-mig-mixed", MIXED, None),
    "MIG mixed, time-sliced": ("a100-40gb-mig-mixed", "time-slicing-configmap.yaml", "a100-40gb"),
}


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
@pytest.mark.parametrize("profile", PROFILES)
async def test_every_cdi_name_allocate_returns_resolves_in_the_spec(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, profile: str, strategy: str
) -> None:
    hardware, config, entry = PROFILES[profile]
    path = None
    if config is not None and config.endswith(".yaml"):
        path = EXAMPLES / config
    elif config is not None:
        path = tmp_path / "config.yaml"
        path.write_text(config)
    running = await launcher.start(
        hardware, config=path, config_name=entry, flags={"device-list-strategy": strategy}
    )
    await running.registered(kubelet)
    spec = spec_on_disk(launcher)
    assert spec is not None
    assert spec["kind"] == KIND
    returned = await every_answer(kubelet, running)
    assert returned <= qualified_names(spec)
    # Nothing more than the devices served: one CDI device per GPU or MIG device.
    assert len(spec["devices"]) == len({n.split("::")[0] for r in running.served
                                        for n in kubelet.devices(r)})  # fmt: skip


async def test_index_names_resolve_on_mig_mixed(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """deviceIDStrategy index: names such as "0:1" need (and get) cdiVersion 0.5.0."""
    (tmp_path / "config.yaml").write_text(MIXED)
    flags = {"device-list-strategy": "cdi-cri", "device-id-strategy": "index"}
    running = await launcher.start("a100-40gb-mig-mixed", config=tmp_path / "config.yaml",
                                   flags=flags)  # fmt: skip
    await running.registered(kubelet)
    spec = spec_on_disk(launcher)
    assert spec is not None
    assert spec["cdiVersion"] == "0.5.0"
    returned = await every_answer(kubelet, running)
    assert f"{KIND}=0:0" in returned
    assert returned <= qualified_names(spec)


async def test_the_spec_outlives_the_agent_and_the_next_one_takes_it_over(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """Between two agents (a rolling update) a restarting container still resolves its
    devices; the next agent leaves the same spec untouched and removes it once its
    config no longer asks for CDI."""
    config = tmp_path / "config.yaml"
    config.write_text(_with_strategy(time_slicing(4), "cdi-cri"))
    first = await launcher.start("t4x4", config=config)
    await first.registered(kubelet)
    names = await every_answer(kubelet, first)
    await first.shutdown()
    spec = spec_on_disk(launcher)
    assert spec is not None
    assert names <= qualified_names(spec)
    written = stamp(launcher)

    second = await launcher.start("t4x4", config=config)
    await second.registered(kubelet)
    assert stamp(launcher) == written
    write_file(config, _with_strategy(time_slicing(4), "envvar"))
    assert await second.reload()
    assert os.listdir(launcher.cdi_spec_dir) == []


def _with_strategy(config: str, strategy: str) -> str:
    return config.replace("version: v1\n", f"version: v1\nflags:\n  plugin:\n"
                          f"    deviceListStrategy: {strategy}\n")  # fmt: skip


def _mig(strategy: str) -> str:
    """A cdi-cri config with this MIG strategy."""
    plugin = "  plugin:\n    deviceListStrategy: cdi-cri\n"
    return f"version: v1\nflags:\n  migStrategy: {strategy}\n{plugin}"


async def test_a_reload_writes_the_spec_for_cdi_and_removes_it_for_envvar(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(time_slicing(4))
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    assert spec_on_disk(launcher) is None

    write_file(config, _with_strategy(time_slicing(4), "cdi-cri"))
    assert await running.reload()
    spec = spec_on_disk(launcher)
    assert spec is not None
    assert await every_answer(kubelet, running) <= qualified_names(spec)

    write_file(config, _with_strategy(time_slicing(4), "envvar"))
    assert await running.reload()
    assert os.listdir(launcher.cdi_spec_dir) == []


async def test_a_new_mig_layout_rewrites_the_spec(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """migStrategy mixed -> none: GPU 0's MIG devices give way to the GPU itself."""
    config = tmp_path / "config.yaml"
    config.write_text(_mig("mixed"))
    running = await launcher.start("a100-40gb-mig-mixed", config=config)
    await running.registered(kubelet)
    before = spec_on_disk(launcher)
    assert before is not None
    assert len(before["devices"]) == 5

    write_file(config, _mig("none"))
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 2}))
    after = spec_on_disk(launcher)
    assert after is not None
    assert qualified_names(after) == {f"{KIND}={running.gpu_uuid(i)}" for i in (0, 1)}
    assert await every_answer(kubelet, running) <= qualified_names(after)


async def test_a_rename_or_an_unhealthy_gpu_leaves_the_spec_untouched(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    """The same physical devices under another resource name resolve as before, and a
    GPU marked unhealthy keeps its name: a restarting container of a pod that holds it
    must still resolve it. The file is not even rewritten."""
    config = tmp_path / "config.yaml"
    config.write_text(_with_strategy(time_slicing(4), "cdi-cri"))
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    before = stamp(launcher)
    spec = spec_on_disk(launcher)
    assert spec is not None
    names = qualified_names(spec)

    write_file(config, _with_strategy(time_slicing(4, rename=True), "cdi-cri"))
    assert await running.reload()
    await kubelet.wait_for(lambda k: serving(k, {"nvidia.com/gpu.shared": 16}))
    assert await every_answer(kubelet, running) <= names

    bad = running.gpu_uuid(2)
    running.inject(gpu=2, xid=79)
    await kubelet.wait_for(
        lambda k: (
            {d for d, s in k.devices("nvidia.com/gpu.shared").items() if not s.healthy}
            == {f"{bad}::{n}" for n in range(4)}
        )
    )
    assert stamp(launcher) == before
    assert f"{KIND}={bad}" in names


def toolkit_spec(directory: str, devices: list[str]) -> None:
    """The NVIDIA Container Toolkit's generated spec (nvidia.yaml), as 1.18 writes it."""
    os.makedirs(directory, exist_ok=True)
    entries = "".join(
        f'- name: "{d}"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n'
        for d in devices
    )
    Path(directory, "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        + entries
        + "containerEdits:\n  mounts:\n  - hostPath: /usr/lib/libcuda.so.1\n"
        + "    containerPath: /usr/lib/libcuda.so.1\n"
    )


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
async def test_the_toolkits_own_devices_are_named_beside_ours(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, strategy: str
) -> None:
    """gpuslice's spec injects device nodes only; the driver's libraries come from the
    toolkit's spec, so each answer names nvidia.com/gpu=<uuid> from it too."""
    config = tmp_path / "config.yaml"
    config.write_text(_with_strategy(time_slicing(4), strategy))
    uuids = [g.uuid for g in load_spec("t4x4").gpus]
    toolkit_spec(launcher.cdi_spec_dir, [*uuids, *map(str, range(len(uuids))), "all"])
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    assert running.devices.cdi_problem is None
    for device in sorted(kubelet.devices(GPU)):
        (answer,) = await kubelet.allocate(GPU, [[device]])
        gpu = device.split("::")[0]
        assert cdi_names(answer) == {f"{KIND}={gpu}", f"nvidia.com/gpu={gpu}"}


async def test_mig_devices_are_named_by_the_toolkits_index_when_it_has_no_uuid(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    (tmp_path / "config.yaml").write_text(_mig("mixed"))
    toolkit_spec(launcher.cdi_spec_dir, ["0", "0:0", "0:1", "0:2", "0:3", "all"])
    running = await launcher.start("a100-40gb-mig-mixed", config=tmp_path / "config.yaml")
    await running.registered(kubelet)
    names = await every_answer(kubelet, running)
    toolkit = {n for n in names if n.startswith("nvidia.com/gpu=")}
    assert toolkit
    assert toolkit <= {f"nvidia.com/gpu={i}" for i in ("0:0", "0:1", "0:2", "0:3")}


async def test_a_missing_toolkit_spec_is_said_once_and_kept_for_readiness(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(_with_strategy(time_slicing(4), "cdi-cri"))
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    problem = running.devices.cdi_problem
    assert problem is not None
    assert "\n" not in problem
    assert problem.startswith(f"no CDI spec of kind nvidia.com/gpu in {launcher.cdi_spec_dir}")
    (device,) = sorted(kubelet.devices(GPU))[:1]
    (answer,) = await kubelet.allocate(GPU, [[device]])
    assert all(n.startswith(KIND) for n in cdi_names(answer))  # served all the same


async def _toolkit_named(kubelet: KubeletStandin, gpu: str, device: str) -> bool:
    (answer,) = await kubelet.allocate(GPU, [[device]])
    return f"nvidia.com/gpu={gpu}" in cdi_names(answer)


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> float:
    """Seconds until `check()` holds, asked every 20 ms (a bound only against a hang)."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < 30, f"not within 30 s: {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@pytest.mark.parametrize("where", ["cdi_static_dir", "cdi_spec_dir"])
async def test_a_toolkit_spec_appearing_or_going_is_followed_without_a_reload(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, where: str
) -> None:
    """The toolkit's spec written after the agent started (in /etc/cdi or /var/run/cdi)
    is named by the next Allocates, with no reload; renamed away, it is no longer named
    (a runtime would refuse an unresolvable CDI device), and readiness says so."""
    config = tmp_path / "config.yaml"
    config.write_text(_with_strategy(time_slicing(4), "cdi-cri"))
    running = await launcher.start("t4x4", config=config)
    await running.registered(kubelet)
    device = sorted(kubelet.devices(GPU))[0]
    gpu = device.split("::")[0]
    assert not await _toolkit_named(kubelet, gpu, device)
    assert running.devices.cdi_problem is not None

    directory = getattr(launcher, where)
    uuids = [g.uuid for g in load_spec("t4x4").gpus]
    toolkit_spec(directory, [*uuids, "all"])
    appeared = await _until(lambda: _toolkit_named(kubelet, gpu, device), "named")
    assert running.devices.cdi_problem is None

    os.rename(os.path.join(directory, "nvidia.yaml"), os.path.join(directory, "nvidia.old"))

    async def gone() -> bool:
        return not await _toolkit_named(kubelet, gpu, device)

    went = await _until(gone, "no longer named")
    assert running.devices.cdi_problem is not None
    print(f"toolkit spec followed: named {appeared:.2f} s after it appeared, {went:.2f} s gone")
