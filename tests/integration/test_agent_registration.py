"""The agent registers each resource of a node with the right name, socket,
count, options, health and NUMA topology, as the kubelet stand-in sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agent_harness import (
    EXAMPLES,
    GPU,
    AgentLauncher,
    gpus_of,
    is_socket,
    registrations,
    serving,
)
from conftest import Logged

from gpuslice.adapters.deviceplugin.api import API_VERSION
from gpuslice.core.resources import socket_name
from gpuslice.core.response import Mount
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin


@dataclass(frozen=True)
class Case:
    hardware: str
    expected: dict[str, int]  # resource -> devices
    sockets: dict[str, str]  # resource -> endpoint
    config: str | None = None
    config_name: str | None = None
    flags: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()  # resources that must not be registered
    numa: tuple[int | None, ...] = ()  # per GPU index; () = none anywhere


MIG_SOCKETS = {
    GPU: "nvidia-gpu.sock",
    "nvidia.com/mig-1g.5gb": "nvidia-mig-1g.5gb.sock",
    "nvidia.com/mig-2g.10gb": "nvidia-mig-2g.10gb.sock",
    "nvidia.com/mig-3g.20gb": "nvidia-mig-3g.20gb.sock",
}

CASES = {
    "t4-defaults": Case("t4", {GPU: 1}, {GPU: "nvidia-gpu.sock"}, numa=(None,)),
    "t4x4-time-slicing": Case(
        "t4x4",
        {GPU: 16},
        {GPU: "nvidia-gpu.sock"},
        config="time-slicing.yaml",
        numa=(0, 0, 0, 0),
    ),
    "t4x4-renamed": Case(
        "t4x4",
        {"nvidia.com/gpu.shared": 16},
        {"nvidia.com/gpu.shared": "nvidia-gpu.shared.sock"},
        config="time-slicing-renamed.yaml",
        absent=(GPU,),
        numa=(0, 0, 0, 0),
    ),
    "dgx-a100": Case("dgx-a100", {GPU: 8}, {GPU: "nvidia-gpu.sock"}, numa=(3, 3, 1, 1, 7, 7, 5, 5)),
    "mig-mixed-configmap": Case(
        "a100-40gb-mig-mixed",
        {
            GPU: 8,  # GPU 1 (MIG disabled) x 8 replicas
            "nvidia.com/mig-1g.5gb": 4,  # two 1g.5gb x 2
            "nvidia.com/mig-2g.10gb": 2,
            "nvidia.com/mig-3g.20gb": 3,
        },
        MIG_SOCKETS,
        config="time-slicing-configmap.yaml",
        config_name="a100-40gb",
        absent=("nvidia.com/mig-7g.40gb",),  # configured, but no such MIG device
        numa=(0, 0),
    ),
    "mig-single": Case(
        "a100-40gb-mig-single",
        {GPU: 7},
        {GPU: "nvidia-gpu.sock"},
        flags={"mig-strategy": "single"},
        numa=(0,),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_every_resource_registers_once_with_its_socket_count_and_health(
    kubelet: KubeletStandin, launcher: AgentLauncher, case: Case
) -> None:
    config = None if case.config is None else EXAMPLES / case.config
    running = await launcher.start(
        case.hardware, config=config, config_name=case.config_name, flags=case.flags
    )
    assert running.served == case.expected
    await kubelet.wait_for(lambda k: serving(k, case.expected))

    assert kubelet.resources() == sorted(case.expected)
    assert registrations(kubelet) == dict.fromkeys(case.expected, 1)
    for record in kubelet.registrations:
        assert record.accepted, record.error
        assert record.version == API_VERSION
        assert record.endpoint == case.sockets[record.resource]
    for name, endpoint in case.sockets.items():
        assert kubelet.endpoint(name) == endpoint
        assert is_socket(running.socket(endpoint))
        options = kubelet.options(name)
        assert options is not None
        assert options.get_preferred_allocation_available
        assert not options.pre_start_required
    status = kubelet.node_status()
    assert status.capacity == case.expected
    assert status.allocatable == case.expected
    for name in case.absent:
        assert name not in kubelet.resources()
        assert not is_socket(running.socket(socket_name(name)))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_numa_topology_follows_the_profile(
    kubelet: KubeletStandin, launcher: AgentLauncher, case: Case
) -> None:
    """Each device carries its GPU's NUMA node; a GPU without one sends no topology."""
    config = None if case.config is None else EXAMPLES / case.config
    running = await launcher.start(
        case.hardware, config=config, config_name=case.config_name, flags=case.flags
    )
    await kubelet.wait_for(lambda k: serving(k, case.expected))
    by_uuid = {g.uuid: g for g in running.devices.snapshot.gpus}
    mig_parent = {m.uuid: g.uuid for g in by_uuid.values() for m in g.mig_devices}
    for name in case.expected:
        for device in kubelet.devices(name).values():
            (physical,) = gpus_of([device.id])
            gpu = by_uuid[mig_parent.get(physical, physical)]
            want = case.numa[gpu.index]
            assert device.numa_nodes == (() if want is None else (want,)), device


async def test_mps_allocation_points_the_container_at_the_daemon(
    kubelet: KubeletStandin, launcher: AgentLauncher, mps_root: Path
) -> None:
    """examples/mps.yaml: 4 MPS replicas per GPU; an admitted container gets the MPS
    pipe directory env and the pipe and shm mounts under mpsRoot, and a container
    asking for two replicas is refused (MPS default)."""
    root = str(mps_root)  # the daemons' directories go here, not to the host's /run
    running = await launcher.start("t4x4", config=EXAMPLES / "mps.yaml", env={"MPS_ROOT": root})
    await running.registered(kubelet)
    assert running.served == {GPU: 16}

    (admitted,) = await kubelet.admit("mps-pod", {"main": {GPU: 1}})
    alloc = admitted.allocation
    assert alloc.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert alloc.envs["NVIDIA_VISIBLE_DEVICES"] == gpus_of(admitted.device_ids).pop()
    assert set(alloc.mounts) == {
        Mount("/mps/nvidia.com/gpu/pipe", f"{root}/nvidia.com/gpu/pipe"),
        Mount("/mps/nvidia.com/gpu/log", f"{root}/nvidia.com/gpu/log"),
        Mount("/dev/shm", f"{root}/nvidia.com/gpu/shm"),
    }
    with pytest.raises(AdmissionError) as refused:
        await kubelet.admit("greedy", {"main": {GPU: 2}})
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "sharing.mps.failRequestsGreaterThanOne" in refused.value.message


async def test_mps_root_from_env_overrides_the_file(
    kubelet: KubeletStandin, launcher: AgentLauncher, mps_root: Path
) -> None:
    """MPS_ROOT in the environment beats flags.mpsRoot in the file."""
    root = str(mps_root)
    running = await launcher.start("t4x4", config=EXAMPLES / "mps.yaml", env={"MPS_ROOT": root})
    await running.registered(kubelet)
    (admitted,) = await kubelet.admit("mps-pod", {"main": {GPU: 1}})
    assert Mount("/dev/shm", f"{root}/nvidia.com/gpu/shm") in admitted.allocation.mounts


async def test_a_mig_enabled_gpu_without_mig_devices_is_served_around_with_a_warning(
    kubelet: KubeletStandin, launcher: AgentLauncher, tmp_path: Path, logged: Logged
) -> None:
    """mixed strategy: GPU 0 has MIG on and no MIG devices, GPU 1 two 3g.20gb. The
    node is served (GPU 0 advertises nothing), and the log says why, as upstream."""
    node = tmp_path / "node.yaml"
    node.write_text(
        "name: half-configured\ngpus:\n"
        "  - {model: a100-40gb, mig_enabled: true, mig_devices: []}\n"
        "  - model: a100-40gb\n    mig_enabled: true\n"
        "    mig_devices: [{profile: 3g.20gb, gi: 1}, {profile: 3g.20gb, gi: 2}]\n"
    )
    running = await launcher.start(str(node), flags={"mig-strategy": "mixed"})
    await running.registered(kubelet)
    assert running.served == {"nvidia.com/mig-3g.20gb": 2}
    (warning,) = [e for e in logged if e["event"] == "hardware_layout_warning"]
    assert warning["detail"].startswith("migStrategy mixed: MIG-enabled GPU 0 (GPU-")
    assert warning["detail"].endswith("has no MIG devices; nothing is advertised from it")
