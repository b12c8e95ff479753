"""Allocate answers through the real gRPC path, per device-list strategy and ID
strategy, set by flag, env var or config file (flag beats env beats file)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from agent_harness import EXAMPLES, GPU, AgentLauncher, RunningAgent

from gpuslice.core.response import ContainerAllocation, DeviceSpec, Mount
from gpuslice.testing.kubelet import KubeletStandin

LIST_ROOT = "/var/run/nvidia-container-devices"
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
Check = Callable[[ContainerAllocation, list[str]], None]


def _envvar(a: ContainerAllocation, uuids: list[str]) -> None:
    assert a == ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)})


def _volume_mounts(a: ContainerAllocation, uuids: list[str]) -> None:
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": LIST_ROOT}
    assert a.mounts == tuple(Mount(f"{LIST_ROOT}/{u}", "/dev/null") for u in uuids)
    assert (a.annotations, a.cdi_devices, a.device_specs) == ({}, (), ())


def _cdi_annotations(a: ContainerAllocation, uuids: list[str]) -> None:
    ((key, value),) = a.annotations.items()
    assert key.startswith("cdi.k8s.io/nvidia-device-plugin_")
    assert value == ",".join(f"{CDI_KIND}={u}" for u in uuids)
    assert (a.envs, a.mounts, a.cdi_devices) == ({}, (), ())


def _cdi_cri(a: ContainerAllocation, uuids: list[str]) -> None:
    assert a == ContainerAllocation(cdi_devices=tuple(f"{CDI_KIND}={u}" for u in uuids))


def _device_specs(a: ContainerAllocation, uuids: list[str]) -> None:
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    # t4x4 GPUs 0 and 1 have minors 0 and 1; no driver control nodes exist here.
    assert a.device_specs == tuple(
        DeviceSpec(f"/dev/nvidia{i}", f"/host/dev/nvidia{i}", "rw") for i in range(len(uuids))
    )


def _index(a: ContainerAllocation, uuids: list[str]) -> None:
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(uuids)))}


STRATEGIES: dict[str, tuple[dict[str, str], Check]] = {
    "envvar": ({}, _envvar),
    "volume-mounts": ({"device-list-strategy": "volume-mounts"}, _volume_mounts),
    "cdi-annotations": ({"device-list-strategy": "cdi-annotations"}, _cdi_annotations),
    "cdi-cri": ({"device-list-strategy": "cdi-cri"}, _cdi_cri),
    "envvar+volume-mounts": ({"device-list-strategy": "envvar,volume-mounts"}, _volume_mounts),
    "pass-device-specs": ({"pass-device-specs": "true", "dev-root": "/host"}, _device_specs),
    "index": ({"device-id-strategy": "index"}, _index),
}
# The env vars that set the same flags.
ENV_NAMES = {
    "device-list-strategy": "DEVICE_LIST_STRATEGY",
    "pass-device-specs": "PASS_DEVICE_SPECS",
    "dev-root": "NVIDIA_DEV_ROOT",
    "device-id-strategy": "DEVICE_ID_STRATEGY",
}


async def _time_sliced_t4x4(
    kubelet: KubeletStandin,
    launcher: AgentLauncher,
    *,
    flags: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    config: Path = EXAMPLES / "time-slicing.yaml",
) -> RunningAgent:
    running = await launcher.start("t4x4", config=config, flags=flags, env=env)
    await running.registered(kubelet)
    return running


@pytest.mark.parametrize("source", ["flag", "env"])
@pytest.mark.parametrize("strategy", STRATEGIES.keys())
async def test_allocate_follows_the_strategy_set_by_flag_or_env(
    kubelet: KubeletStandin, launcher: AgentLauncher, strategy: str, source: str
) -> None:
    settings, check = STRATEGIES[strategy]
    flags = settings if source == "flag" else {}
    env = {ENV_NAMES[k]: v for k, v in settings.items()} if source == "env" else {}
    running = await _time_sliced_t4x4(kubelet, launcher, flags=flags, env=env)
    g0, g1 = running.gpu_uuid(0), running.gpu_uuid(1)
    same, spread = await kubelet.allocate(GPU, [[f"{g0}::0", f"{g0}::3"], [f"{g0}::1", f"{g1}::2"]])
    check(same, [g0])  # replicas of one GPU: one visible device
    check(spread, [g0, g1])


async def test_admitted_pod_gets_the_same_answer_as_a_direct_allocate(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    """The kubelet's admission path (preferred allocation, then Allocate) ends in
    the strategy's answer for the devices it picked."""
    await _time_sliced_t4x4(kubelet, launcher, flags={"device-list-strategy": "volume-mounts"})
    (admitted,) = await kubelet.admit("pod", {"main": {GPU: 2}})
    uuids = list(dict.fromkeys(d.split("::")[0] for d in admitted.device_ids))
    _volume_mounts(admitted.allocation, uuids)


async def test_each_cdi_annotation_key_is_unique(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await _time_sliced_t4x4(
        kubelet, launcher, flags={"device-list-strategy": "cdi-annotations"}
    )
    g0 = running.gpu_uuid(0)
    first, second = await kubelet.allocate(GPU, [[f"{g0}::0"], [f"{g0}::1"]])
    assert first.annotations.keys().isdisjoint(second.annotations.keys())


def _config_with(tmp_path: Path, plugin_flags: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\n"
        f"flags:\n  plugin:\n{plugin_flags}"
        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    return path


PRECEDENCE = {
    "file": ({}, {}, _volume_mounts),
    "env beats file": ({}, {"DEVICE_LIST_STRATEGY": "cdi-cri"}, _cdi_cri),
    "flag beats env and file": (
        {"device-list-strategy": "envvar"},
        {"DEVICE_LIST_STRATEGY": "cdi-cri"},
        _envvar,
    ),
}


@pytest.mark.parametrize("case", PRECEDENCE.keys())
async def test_list_strategy_precedence_flag_env_file(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, case: str
) -> None:
    flags, env, check = PRECEDENCE[case]
    config = _config_with(tmp_path, "    deviceListStrategy: volume-mounts\n")
    running = await _time_sliced_t4x4(kubelet, launcher, flags=flags, env=env, config=config)
    g0 = running.gpu_uuid(0)
    (alloc,) = await kubelet.allocate(GPU, [[f"{g0}::2"]])
    check(alloc, [g0])


async def test_id_strategy_from_file_is_overridden_by_env(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path
) -> None:
    config = _config_with(tmp_path, "    deviceIDStrategy: index\n")
    running = await _time_sliced_t4x4(kubelet, launcher, config=config)
    g1 = running.gpu_uuid(1)
    (alloc,) = await kubelet.allocate(GPU, [[f"{g1}::0"]])
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": "1"}
    await launcher.close()
    running = await _time_sliced_t4x4(
        kubelet, launcher, config=config, env={"DEVICE_ID_STRATEGY": "uuid"}
    )
    (alloc,) = await kubelet.allocate(GPU, [[f"{g1}::0"]])
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": g1}
