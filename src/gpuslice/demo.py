"""`gpuslice demo`: the agent on a simulated node against the kubelet stand-in."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpuslice import logs
from gpuslice.adapters.kubelet.standin import KubeletStandin
from gpuslice.adapters.kubelet.standin.records import AdmittedContainer, InsufficientResourceError
from gpuslice.core.devices import Gpu
from gpuslice.core.errors import ConfigError
from gpuslice.services.agent import Agent
from gpuslice.wiring import RunOptions, agent_deps

GPU = "nvidia.com/gpu"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_CONFIG = EXAMPLES / "dgx-a100-demo.yaml"
FAULTY_GPU = 3

# pod -> container -> {resource: count}
PODS: dict[str, dict[str, dict[str, int]]] = {
    "notebook-alice": {"jupyter": {GPU: 1}},
    "notebook-bob": {"jupyter": {GPU: 1}},
    "inference": {"model-a": {GPU: 1}, "model-b": {GPU: 1}},
    "trainer": {"main": {GPU: 2}},
}


async def run_demo(profile: str, *, verbose: bool, out: Callable[[str], None]) -> None:
    if not DEMO_CONFIG.is_file():
        raise ConfigError(f"demo config not found at {DEMO_CONFIG}; run from a gpuslice checkout")
    logs.setup("info" if verbose else "error")
    work = tempfile.mkdtemp(prefix="gpuslice-demo-", dir="/tmp")
    try:
        await _walkthrough(profile, work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _walkthrough(profile: str, work: str, out: Callable[[str], None]) -> None:
    events = os.path.join(work, "events.jsonl")
    opts = RunOptions(
        cli_values={
            "config-file": str(DEMO_CONFIG),
            "kubelet-socket": os.path.join(work, "kubelet.sock"),
        },
        fake_hardware=profile,
        fake_events=events,
    )
    agent = Agent(agent_deps(opts))
    stop = asyncio.Event()
    async with KubeletStandin(work) as kubelet:
        task = asyncio.create_task(agent.run(stop))
        try:
            await _until(agent.ready, task)
            want = {h.resource.name: len(h.devices()) for h in agent.manager.handlers.values()}
            names = list(want)
            await kubelet.wait_for(lambda k: all(len(k.devices(n)) == c for n, c in want.items()))
            snapshot = agent.snapshot
            gpus = {g.uuid: g for g in snapshot.gpus}
            out(f"== Simulated node '{profile}': {len(gpus)}x {snapshot.gpus[0].name}")
            out(f"   config {DEMO_CONFIG.relative_to(EXAMPLES.parent)}")
            for line in _describe_config(agent):
                out(f"   {line}")
            out("\n== Registered with the kubelet stand-in (device-plugin v1beta1)")
            for name in names:
                opt = kubelet.options(name)
                pref = "yes" if opt and opt.get_preferred_allocation_available else "no"
                out(
                    f"   {name:<24} endpoint {kubelet.endpoint(name)}  preferred allocation: {pref}"
                )
            out("\n== kubectl describe node (extended resources)")
            out(_indent(_capacity(kubelet)))
            out("\n== Admitting pods")
            out(f"   {'POD/CONTAINER':<24} {'DEVICE ID':<46} {'GPU':<4} NVIDIA_VISIBLE_DEVICES")
            for pod, containers in PODS.items():
                for admitted in await kubelet.admit(pod, containers):
                    for line in _admitted(admitted, gpus):
                        out(f"   {line}")
            try:
                await kubelet.admit("too-big", {"main": {GPU: 64}})
            except InsufficientResourceError as exc:
                out(f"   too-big asks for 64: stays Pending ({exc})")
            out(f"\n== Fault: XID 79 (fallen off the bus) injected on GPU {FAULTY_GPU}")
            _append_event(events, {"gpu": FAULTY_GPU, "xid": 79})
            bad = snapshot.gpus[FAULTY_GPU].uuid
            await kubelet.wait_for(lambda k: _unhealthy(k, bad) > 0, 5)
            out(
                f"   every replica of GPU {FAULTY_GPU} is now Unhealthy: {_unhealthy(kubelet, bad)}"
            )
            out(_indent(_capacity(kubelet)))
            late = await kubelet.admit("after-fault", {"main": {GPU: 1}})
            gpu = gpus[late[0].allocation.envs.get("NVIDIA_VISIBLE_DEVICES", "")]
            out(f"   a new pod still gets a healthy GPU: after-fault -> GPU {gpu.index}")
        finally:
            stop.set()
            await task
        left = [n for n in os.listdir(work) if n.endswith(".sock") and n != "kubelet.sock"]
        out("\n== Agent stopped: plugin sockets left behind: " + (", ".join(left) or "none"))


async def _until(event: asyncio.Event, task: asyncio.Task[None]) -> None:
    """Wait for `event`, failing fast if the agent task ends first."""
    waiter = asyncio.create_task(event.wait())
    done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises the agent's error
        raise ConfigError("the agent stopped before serving anything")


def _describe_config(agent: Agent) -> list[str]:
    lines = []
    for handler in agent.manager.handlers.values():
        r = handler.resource
        physical = len({d.physical_id for d in r.devices})
        lines.append(
            f"{r.name}: {len(r.devices)} devices on {physical} physical, sharing {r.sharing}"
        )
    return lines


def _capacity(kubelet: KubeletStandin) -> str:
    status = kubelet.node_status()
    lines = ["Capacity:"] + [f"  {n}:  {c}" for n, c in sorted(status.capacity.items())]
    lines += ["Allocatable:"] + [f"  {n}:  {c}" for n, c in sorted(status.allocatable.items())]
    return "\n".join(lines)


def _admitted(a: AdmittedContainer, gpus: dict[str, Gpu]) -> list[str]:
    visible = a.allocation.envs.get("NVIDIA_VISIBLE_DEVICES", "")
    lines = []
    for i, device_id in enumerate(a.device_ids):
        gpu = gpus.get(device_id.split("::")[0])
        where = str(gpu.index) if gpu else "?"
        who = f"{a.pod}/{a.container}" if i == 0 else ""
        env = visible if i == 0 else ""
        lines.append(f"{who:<24} {device_id:<46} {where:<4} {env}")
    return lines


def _unhealthy(kubelet: KubeletStandin, gpu_uuid: str) -> int:
    devs = kubelet.devices(GPU).values()
    return sum(1 for d in devs if not d.healthy and d.id.startswith(gpu_uuid))


def _append_event(path: str, event: dict[str, int]) -> None:
    """What a person or a test does to inject a fault into the simulated backend."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")


def _indent(text: str) -> str:
    return "\n".join(f"   {line}" for line in text.splitlines())
