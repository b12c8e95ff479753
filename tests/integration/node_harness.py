"""The whole Node as `gpuslice run` wires it in node mode: the agent, the per-node config
manager over a mounted ConfigMap directory (real files, the kubelet's `..data` swap) and
the labeller, with MemoryNodeApi playing the cluster. Every wait is on a condition."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent_harness import STOP_TIMEOUT_S, shutdown_all

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.nfd_file import parse
from gpuslice.config.options import RunOptions, resolve_options
from gpuslice.config.settings import Settings
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import GpuBackend, LabelSink
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.services.config_manager import ConfigManager
from gpuslice.services.node import Node, serve_config
from gpuslice.testing.configmap import write_configmap_volume
from gpuslice.testing.nodeapi import MemoryNodeApi
from gpuslice.wiring.agent import Parts, device_plugin_of, parts
from gpuslice.wiring.node import build_node, node_config, node_labeller, node_labels

NODE = "gpu-node-7"
NAMESPACE = "gpu-operator"
WITHIN_S = 1.0  # a label change or a ConfigMap edit must be served this soon
SHARED = "nvidia.com/gpu.shared"
REJECTED = "ConfigRejected"


def time_slicing(replicas: int, *, rename: bool = False) -> str:
    rename_line = "    renameByDefault: true\n" if rename else ""
    return (
        "version: v1\nsharing:\n  timeSlicing:\n"
        f"{rename_line}"
        f"    resources:\n    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


CONFIGS = {
    "ts-4": time_slicing(4),
    "ts-8": time_slicing(8),
    "shared-4": time_slicing(4, rename=True),
}


class RecordingSink:
    """Wraps a real LabelSink and wakes waiters on each publish it makes."""

    def __init__(self, inner: LabelSink) -> None:
        self.inner = inner
        self.published: list[dict[str, str]] = []  # every call, written or not
        self._cond = asyncio.Condition()

    async def publish(self, labels: Mapping[str, str]) -> bool:
        written = await self.inner.publish(labels)
        async with self._cond:
            self.published.append(dict(labels))
            self._cond.notify_all()
        return written

    async def remove(self) -> None:
        await self.inner.remove()

    async def wait_published(self, timeout_s: float = 30.0) -> dict[str, str]:
        """The labels of the first publish (at once if there was one)."""
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(lambda: bool(self.published)), timeout_s)
        return self.published[-1]


class GatedOpen:
    """Opens the simulated backend only once the test releases it, as NVML may take
    seconds to initialise: `opening` is set when the agent starts opening it."""

    def __init__(self, hardware: str, timeout_s: float = 10.0) -> None:
        self.hardware = hardware
        self.opening = threading.Event()
        self.released = threading.Event()
        self._timeout_s = timeout_s
        self._events: str | None = None

    def install(self, chosen: Parts) -> Parts:
        self._events = os.path.join(chosen.plugin_dir, "events.jsonl")
        return dataclasses.replace(chosen, open_backend=self._open)

    def _open(self) -> GpuBackend:  # on the agent's worker thread
        self.opening.set()
        if not self.released.wait(self._timeout_s):
            raise BackendError("the test never released the backend's open")
        return FakeBackend.from_spec(self.hardware, self._events)

    async def wait_opening(self, timeout_s: float = 30.0) -> None:
        assert await asyncio.to_thread(self.opening.wait, timeout_s), "the open never started"


@dataclass
class RunningNode:
    node: Node
    api: MemoryNodeApi
    opts: RunOptions
    configs: str  # the mounted ConfigMap directory
    sink: RecordingSink | None
    stop: asyncio.Event
    reload: asyncio.Event
    task: asyncio.Task[None]
    _stopped: bool = field(default=False, repr=False)

    @property
    def manager(self) -> ConfigManager[Settings]:
        manager = self.node.manager
        assert manager is not None
        return manager

    @property
    def served(self) -> dict[str, int]:
        handlers = device_plugin_of(self.node).manager.handlers
        return {n: len(h.devices()) for n, h in handlers.items()}

    def set_label(self, value: str | None) -> None:
        """What `kubectl label node ... nvidia.com/device-plugin.config=<value>` does."""
        self.api.set_labels(NODE, {} if value is None else {DEFAULT_LABEL: value})

    def update_configmap(self, data: Mapping[str, str]) -> None:
        """What the kubelet does after the ConfigMap object was edited."""
        write_configmap_volume(self.configs, data)

    async def checked(self, seen: int, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Wait until the manager finished a read after `seen` and `done()` holds."""

        async def settle() -> None:
            count = seen
            while True:
                count = await self.manager.wait_checked(count)
                if done():
                    return

        await asyncio.wait_for(settle(), timeout_s)

    async def until_started(self, timeout_s: float = 30.0) -> None:
        waiter = asyncio.ensure_future(self.node.agent.ready.wait())
        done, _ = await asyncio.wait(
            {waiter, self.task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            waiter.cancel()
            if self.task in done:
                self.task.result()
            raise TimeoutError(f"node not ready within {timeout_s}s")

    def node_feature(self) -> dict[str, str] | None:
        return self.api.node_feature_labels(NODE, NAMESPACE)

    async def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.stop.set()
        await asyncio.wait_for(self.task, STOP_TIMEOUT_S)


class NodeLauncher:
    """Starts Nodes against the stand-in on `plugin_dir`; leaving the block stops them."""

    def __init__(self, plugin_dir: str, work: Path) -> None:
        self.plugin_dir = plugin_dir
        self.work = work
        self._running: list[RunningNode] = []

    async def __aenter__(self) -> NodeLauncher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(
        self,
        hardware: str = "t4x4",
        *,
        configs: Mapping[str, str] = CONFIGS,
        label: str | None = None,
        default: str | None = "ts-4",
        flags: Mapping[str, str] | None = None,
        api: MemoryNodeApi | None = None,
        wait_ready: bool = True,
        change: Callable[[Parts], Parts] | None = None,
    ) -> RunningNode:
        directory = self.work / f"configs-{len(self._running)}"
        directory.mkdir()
        write_configmap_volume(str(directory), configs)
        api = api or MemoryNodeApi({NODE: {DEFAULT_LABEL: label} if label else {}})
        cli = {
            "kubelet-socket": os.path.join(self.plugin_dir, "kubelet.sock"),
            "config-file-srcdir": str(directory),
            "node-name": NODE,
            "namespace": NAMESPACE,
            **({"default-config": default} if default else {}),
            **(flags or {}),
        }
        opts = resolve_options(
            cli,
            fake_hardware=hardware,
            fake_events=os.path.join(self.plugin_dir, "events.jsonl"),
        )
        chosen = parts(opts)
        built = build_node(opts, api, with_parts=change(chosen) if change else chosen)
        built_parts = built.parts
        sink = None
        if built_parts.labeller is not None:  # the same labeller, its output recorded
            manager, first = node_config(opts, chosen.host, api)
            labels = node_labels(opts, chosen.host, api, first)
            assert labels is not None
            (inner,) = labels.sinks
            sink = RecordingSink(inner)
            labels = dataclasses.replace(labels, sinks=[sink])
            labeller = node_labeller(built.devices, labels, built_parts.isolation, built_parts.mig)
            apply = serve_config(built.agent, labeller)
            built_parts = dataclasses.replace(
                built_parts, labeller=labeller, manager=manager(apply)
            )
        node = Node(built_parts)
        stop, reload = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(node.run(stop, reload))
        running = RunningNode(node, api, opts, str(directory), sink, stop, reload, task)
        self._running.append(running)
        if wait_ready:
            await running.until_started()
        return running

    async def close(self) -> None:
        await shutdown_all(self._running)


def file_labels(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The labels of a features file, None when there is none."""
    try:
        return parse(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
