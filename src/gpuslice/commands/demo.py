"""`gpuslice demo`: the agent on a simulated node against the kubelet stand-in, with its
config chosen by a node label from a mounted ConfigMap and switched live."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib import resources

from gpuslice import logs
from gpuslice.commands.demo_isolation import isolation_walkthrough
from gpuslice.config.options import resolve_options
from gpuslice.core.devices import Gpu
from gpuslice.core.errors import ConfigError
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.core.waiting import first_of
from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.kubelet.records import (
    AdmittedContainer,
    InsufficientResourceError,
    StandinError,
)
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.agent import device_plugin_of
from gpuslice.wiring.node import Node, build_node

GPU = "nvidia.com/gpu"
# Package data, so the demo runs from a wheel or an image (examples/ links to it).
DEMO_CONFIG = resources.files("gpuslice").joinpath("data", "dgx-a100-demo.yaml")
FAULTY_GPU = 3  # or the last GPU of a smaller node
NODE = "demo-node"
NAMESPACE = "default"
SHOWN_LABELS = ("gpu.product", "gpu.count", "gpu.replicas", "gpu.sharing-strategy")

# pod -> container -> {resource: count}
PODS: dict[str, dict[str, dict[str, int]]] = {
    "notebook-alice": {"jupyter": {GPU: 1}},
    "notebook-bob": {"jupyter": {GPU: 1}},
    "inference": {"model-a": {GPU: 1}, "model-b": {GPU: 1}},
    "trainer": {"main": {GPU: 2}},
}


async def run_demo(profile: str, *, verbose: bool, out: Callable[[str], None]) -> None:
    logs.setup("info" if verbose else "error")
    work = tempfile.mkdtemp(prefix="gpuslice-demo-", dir="/tmp")
    try:
        await _walkthrough(profile, work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _walkthrough(profile: str, work: str, out: Callable[[str], None]) -> None:
    events = os.path.join(work, "events.jsonl")
    configs = os.path.join(work, "configs")
    os.mkdir(configs)
    text = DEMO_CONFIG.read_text(encoding="utf-8")
    write_configmap_volume(
        configs, {"ts-4": text, "ts-8": text.replace("replicas: 4", "replicas: 8")}
    )
    api = MemoryNodeApi({NODE: {}})
    opts = resolve_options(
        {
            "kubelet-socket": os.path.join(work, "kubelet.sock"),
            "config-file-srcdir": configs,
            "default-config": "ts-4",
            "node-name": NODE,
            "namespace": NAMESPACE,
        },
        fake_hardware=profile,
        fake_events=events,
    )
    node = build_node(opts, api)
    agent, plugin = node.agent, device_plugin_of(node)
    stop = asyncio.Event()
    async with KubeletStandin(work) as kubelet:
        task = asyncio.create_task(node.run(stop))
        try:
            await _until(agent.ready, task)
            want = {h.resource.name: len(h.devices()) for h in plugin.manager.handlers.values()}
            names = list(want)
            await kubelet.wait_for(lambda k: all(len(k.devices(n)) == c for n, c in want.items()))
            snapshot = node.devices.snapshot
            gpus = {g.uuid: g for g in snapshot.gpus}
            out(f"== Simulated node '{profile}': {len(gpus)}x {snapshot.gpus[0].name}")
            out(f"   mounted ConfigMap: ts-4 ({DEMO_CONFIG.name}), ts-8 (the same with 8 replicas)")
            out(f"   in force: {_config_line(node)}")
            for line in _describe_config(node):
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
            before = await _labels(node, api)
            out(f"\n== Node labels (NodeFeature {NAMESPACE}/nvidia-features-for-{NODE})")
            out(_indent(_show_labels(before, {})))
            out("\n== Admitting pods")
            out(f"   {'POD/CONTAINER':<24} {'DEVICE ID':<46} {'GPU':<4} NVIDIA_VISIBLE_DEVICES")
            for pod, containers in PODS.items():
                try:
                    for admitted in await kubelet.admit(pod, containers):
                        for line in _admitted(admitted, gpus):
                            out(f"   {line}")
                except StandinError as exc:  # a small --profile runs out of replicas
                    out(f"   {pod}: not admitted ({exc})")
            try:
                await kubelet.admit("too-big", {"main": {GPU: 64}})
            except InsufficientResourceError as exc:
                out(f"   too-big asks for 64: stays Pending ({exc})")
            faulty = min(FAULTY_GPU, len(snapshot.gpus) - 1)
            out(f"\n== Fault: XID 79 (fallen off the bus) injected on GPU {faulty}")
            _append_event(events, {"gpu": faulty, "xid": 79})
            bad = snapshot.gpus[faulty].uuid
            await kubelet.wait_for(lambda k: _unhealthy(k, bad) > 0, 5)
            out(f"   every replica of GPU {faulty} is now Unhealthy: {_unhealthy(kubelet, bad)}")
            out(_indent(_capacity(kubelet)))
            try:
                late = await kubelet.admit("after-fault", {"main": {GPU: 1}})
                gpu = gpus[late[0].allocation.envs.get("NVIDIA_VISIBLE_DEVICES", "")]
                out(f"   a new pod still gets a healthy GPU: after-fault -> GPU {gpu.index}")
            except StandinError as exc:
                out(f"   after-fault: not admitted ({exc})")
            await _switch(node, api, kubelet, before, faulty, out)
        finally:
            stop.set()
            await task
        left = [n for n in os.listdir(work) if n.endswith(".sock") and n != "kubelet.sock"]
        out("\n== Agent stopped: plugin sockets left behind: " + (", ".join(left) or "none"))
    await isolation_walkthrough(os.path.join(work, "isolation"), out)


async def _switch(
    node: Node,
    api: MemoryNodeApi,
    kubelet: KubeletStandin,
    before: Mapping[str, str],
    faulty: int,
    out: Callable[[str], None],
) -> None:
    """Flip the node label to ts-8 and show what changed and what did not."""
    manager = node.manager
    assert manager is not None
    count = len(kubelet.devices(GPU))
    out(f"\n== Config switch: kubectl label node {NODE} {DEFAULT_LABEL}=ts-8")
    seen = manager.checks
    started = time.monotonic()
    api.set_labels(NODE, {DEFAULT_LABEL: "ts-8"})
    await kubelet.wait_for(lambda k: len(k.devices(GPU)) == 2 * count)
    took_ms = (time.monotonic() - started) * 1000
    while manager.status.config != "ts-8":
        seen = await manager.wait_checked(seen)
    out(f"   in force: {_config_line(node)}; new list at the kubelet in {took_ms:.0f} ms")
    registered = sum(1 for r in kubelet.registrations if r.accepted and r.resource == GPU)
    held = {
        d for pod in kubelet.allocations().values() for c in pod.values() for d in c.get(GPU, ())
    }
    kept = held <= set(kubelet.devices(GPU))
    out(
        f"   {GPU} kept its registration (registered {registered}x); "
        f"pods' devices {'all still advertised' if kept else 'NOT all advertised'}"
    )
    out(_indent(_capacity(kubelet)))
    bad = node.devices.snapshot.gpus[faulty].uuid
    out(f"   GPU {faulty} stays Unhealthy: {_unhealthy(kubelet, bad)} replicas")
    out("   NodeFeature labels:")
    out(_indent(_show_labels(await _labels(node, api), before), 6))


async def _labels(node: Node, api: MemoryNodeApi) -> dict[str, str]:
    """The NodeFeature object's labels once the labeller has published the current ones."""
    if node.labeller is not None:
        await node.labeller.relabel()  # no write when the background pass already did it
    return api.node_feature_labels(NODE, NAMESPACE) or {}


def _show_labels(labels: Mapping[str, str], before: Mapping[str, str]) -> str:
    lines = []
    for short in SHOWN_LABELS:
        key = f"nvidia.com/{short}"
        value = labels.get(key, "(absent)")
        was = before.get(key)
        change = f"   (was {was})" if before and was != value else ""
        lines.append(f"{key}={value}{change}")
    return "\n".join(lines)


def _config_line(node: Node) -> str:
    assert node.manager is not None
    status = node.manager.status
    return f"{status.config} ({status.detail})"


async def _until(event: asyncio.Event, task: asyncio.Task[None]) -> None:
    """Wait for `event`, failing fast if the agent task ends first."""
    await first_of(task, event.wait())
    if task.done():
        task.result()  # raises the agent's error
        raise ConfigError("the agent stopped before serving anything")


def _describe_config(node: Node) -> list[str]:
    lines = []
    for handler in device_plugin_of(node).manager.handlers.values():
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


def _indent(text: str, spaces: int = 3) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())
