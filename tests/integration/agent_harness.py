"""The whole agent, wired as `gpuslice run` wires it, on simulated hardware.

AgentLauncher starts the node `gpuslice run --config-file` builds (wiring.build_node:
the config manager over the one config file, the agent, the node's device state and
the device-plugin front-end), with the parts a test may swap (wiring.Parts), against
the kubelet stand-in's directory; RunningAgent is one such node with what tests need to
drive and observe it. Every wait is on a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import stat
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuslice.config.options import RunOptions, resolve_options
from gpuslice.core.devices import physical_id
from gpuslice.frontends.deviceplugin import DevicePluginFrontEnd
from gpuslice.services.agent import Agent
from gpuslice.services.node import Node
from gpuslice.services.node_devices import NodeDevices
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.wiring.agent import Parts, device_plugin_of, parts
from gpuslice.wiring.node import build_node, node_api

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
GPU = "nvidia.com/gpu"
STOP_TIMEOUT_S = 10.0


def short_dir(prefix: str = "gsi-") -> str:
    """A fresh directory under /tmp: unix socket paths stay far below 108 bytes."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def write_file(path: str | os.PathLike[str], text: str) -> None:
    """Replace a file's content in place, as an editor or a ConfigMap update would."""
    Path(path).write_text(text, encoding="utf-8")


def registrations(kubelet: KubeletStandin) -> Counter[str]:
    """Accepted Register calls per resource, as the stand-in saw them."""
    return Counter(r.resource for r in kubelet.registrations if r.accepted)


def gpus_of(device_ids: Iterable[str]) -> set[str]:
    """The physical devices behind kubelet device IDs (replica suffixes dropped)."""
    return {physical_id(d) for d in device_ids}


def pod_resources_socket(plugin_dir: str) -> str:
    """Where agents started here read PodResources, and a stand-in may serve it."""
    return os.path.join(plugin_dir, "pr", "kubelet.sock")


def one_node_options(plugin_dir: str, config: str | os.PathLike[str]) -> RunOptions:
    """`gpuslice run --config-file CONFIG` on node-1 of a cluster, simulating a t4x4, no
    labels: for a node built with wiring.build_node around a stand-in API."""
    return resolve_options(
        {
            "kubelet-socket": os.path.join(plugin_dir, "kubelet.sock"),
            "config-file": str(config),
            "node-name": "node-1",
            "labels": "false",
        },
        fake_hardware="t4x4",
    )


serving = KubeletStandin.serves  # (kubelet, {resource: device count}) -> bool


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


@dataclass
class RunningAgent:
    node: Node
    opts: RunOptions
    plugin_dir: str
    events_path: str
    stop: asyncio.Event
    reload_event: asyncio.Event
    task: asyncio.Task[None]
    _stopped: bool = field(default=False, repr=False)

    @property
    def agent(self) -> Agent:
        return self.node.agent

    @property
    def devices(self) -> NodeDevices:
        return self.node.devices

    @property
    def plugin(self) -> DevicePluginFrontEnd:
        return device_plugin_of(self.node)

    async def reload(self) -> bool:
        """What SIGHUP does: read the config file again; False when it was refused."""
        return await self.node.reload()

    @property
    def rejected(self) -> str | None:
        """Why the last reload was refused, until one is not."""
        return self.node.manager.rejected

    @property
    def served(self) -> dict[str, int]:
        """resource -> device count, as the agent serves them now."""
        return {name: len(h.devices()) for name, h in self.plugin.manager.handlers.items()}

    def socket(self, name: str) -> str:
        return os.path.join(self.plugin_dir, name)

    def gpu_uuid(self, index: int) -> str:
        return self.devices.snapshot.gpus[index].uuid

    async def registered(self, kubelet: KubeletStandin, timeout_s: float = 30.0) -> None:
        """Wait until the stand-in streams every resource the agent serves, all healthy."""
        want = self.served
        await kubelet.wait_for(lambda k: serving(k, want), timeout_s)

    def inject(self, **event: object) -> None:
        """Append one health event line, as a person or another process would."""
        with open(self.events_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event) + "\n")

    async def until_ready(self, timeout_s: float = 30.0) -> None:
        """Wait for `agent.ready`, failing at once with the agent's error if it stops first."""
        waiter = asyncio.ensure_future(self.agent.ready.wait())
        done, _ = await asyncio.wait(
            {waiter, self.task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            waiter.cancel()
            if self.task in done:
                self.task.result()
                raise AssertionError("the agent stopped before it was ready")
            raise TimeoutError(f"agent not ready within {timeout_s}s")

    async def shutdown(self) -> None:
        """Set `stop` and wait for run() to return (re-raising its error)."""
        if self._stopped:
            return
        self._stopped = True
        self.stop.set()
        await asyncio.wait_for(self.task, STOP_TIMEOUT_S)


class AgentLauncher:
    """Starts agents on `plugin_dir`; close() stops every one still running."""

    def __init__(self, plugin_dir: str) -> None:
        self.plugin_dir = plugin_dir
        self.kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
        self.cdi_spec_dir = os.path.join(plugin_dir, "cdi")
        self.cdi_static_dir = os.path.join(plugin_dir, "etc-cdi")
        self._running: list[RunningAgent] = []

    def options(
        self,
        hardware: str = "t4",
        *,
        config: str | os.PathLike[str] | None = None,
        config_name: str | None = None,
        flags: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunOptions:
        # CDI specs (cdi-* strategies) go beside the sockets, never to the host's /var/run/cdi;
        # PodResources where a stand-in serving it puts it (pod_resources_socket).
        cli = {
            "kubelet-socket": self.kubelet_socket,
            "cdi-spec-dir": self.cdi_spec_dir,
            "pod-resources-socket": pod_resources_socket(self.plugin_dir),
        }
        if config is not None:
            cli["config-file"] = str(config)
        cli.update(flags or {})
        opts = resolve_options(
            cli,
            dict(env or {}),
            config_name=config_name,
            fake_hardware=hardware,
            fake_events=os.path.join(self.plugin_dir, "events.jsonl"),
        )
        # Nor is the host's /etc/cdi read for the toolkit's spec: a directory of the test's.
        static = dataclasses.replace(opts.device_plugin, cdi_static_dir=self.cdi_static_dir)
        return dataclasses.replace(opts, device_plugin=static)

    async def start(
        self,
        hardware: str = "t4",
        *,
        config: str | os.PathLike[str] | None = None,
        config_name: str | None = None,
        flags: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        wait_ready: bool = True,
        change: Callable[[Parts], Parts] | None = None,
    ) -> RunningAgent:
        """Run a node wired as `gpuslice run` wires it (`change` may swap parts)."""
        opts = self.options(hardware, config=config, config_name=config_name, flags=flags, env=env)
        assert opts.fake_events is not None
        # The simulated backend holds its events file open from the start (to follow a
        # rotation), so that descriptor is there before any census a test takes.
        os.close(os.open(opts.fake_events, os.O_WRONLY | os.O_CREAT, 0o644))
        chosen = parts(opts)
        node = build_node(opts, None, with_parts=change(chosen) if change else chosen)
        stop, reload = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(node.run(stop, reload))
        assert opts.fake_events is not None
        running = RunningAgent(node, opts, self.plugin_dir, opts.fake_events, stop, reload, task)
        self._running.append(running)
        if wait_ready:
            await running.until_ready()
        return running

    async def close(self) -> None:
        await shutdown_all(self._running)


class _Stoppable(Protocol):
    async def shutdown(self) -> None: ...


async def shutdown_all(running: Iterable[_Stoppable]) -> None:
    """Shut every one down, then raise the first failure (stopping them all first)."""
    errors: list[BaseException] = []
    for one in running:
        try:
            await one.shutdown()
        except BaseException as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


async def start_mig_mixed(kubelet: KubeletStandin, launcher: AgentLauncher) -> RunningAgent:
    """Four resources, registered: three MIG profiles on GPU 0 and replicas of GPU 1."""
    running = await launcher.start(
        "a100-40gb-mig-mixed",
        config=EXAMPLES / "time-slicing-configmap.yaml",
        config_name="a100-40gb",
    )
    await running.registered(kubelet)
    assert len(running.served) == 4
    return running


@contextlib.asynccontextmanager
async def node_running(
    opts: RunOptions, kubelet: KubeletStandin, serves: Mapping[str, int], timeout_s: float
) -> AsyncIterator[Node]:
    """The node of `opts` run over its Kubernetes API, once the kubelet stand-in sees it
    serve `serves`; stopped and its API client closed on the way out."""
    api = node_api(opts)
    assert api is not None
    node = build_node(opts, api)
    stop = asyncio.Event()
    task = asyncio.create_task(node.run(stop))
    try:
        await kubelet.wait_for(lambda k: serving(k, serves), timeout_s)
        yield node
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, STOP_TIMEOUT_S)
        await api.aclose()
