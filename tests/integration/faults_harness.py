"""What the fault tests share: a census of fds, threads and tasks to prove nothing
leaked, an agent launcher that can swap the backend or watch the endpoints, a
backend whose NVML-like calls start failing on demand, and a way to end a real
device-plugin server's gRPC server under the agent."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from agent_harness import AgentLauncher, RunningAgent

from gpuslice.adapters.deviceplugin.endpoint import KubeletEndpoint
from gpuslice.adapters.deviceplugin.server import DevicePluginServer
from gpuslice.adapters.fake import FakeBackend
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import PluginEndpoint
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.wiring.agent import Parts

SETTLE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Census:
    """Open fds by kind (sockets, pipes, epoll, each file), live threads and asyncio
    tasks by name. Sockets count by kind: re-registering replaces connections."""

    fds: Counter[str]
    threads: Counter[str]
    tasks: Counter[str]

    @classmethod
    def take(cls) -> Census:
        fds: Counter[str] = Counter()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:  # the fd listdir itself used
                continue
            fds[re.sub(r":\[\d+\]$", "", target)] += 1
        threads = Counter(t.name for t in threading.enumerate())
        tasks = Counter(t.get_coro().__qualname__ for t in asyncio.all_tasks())  # type: ignore[union-attr]
        return cls(fds, threads, tasks)

    def diff(self, other: Census) -> str:
        """What `other` has beyond this one (empty when nothing leaked)."""
        parts = []
        if other.fds - self.fds:
            parts.append(f"fds {dict(other.fds - self.fds)}")
        if other.threads - self.threads:
            parts.append(f"threads {dict(other.threads - self.threads)}")
        if other.tasks - self.tasks:
            parts.append(f"tasks {dict(other.tasks - self.tasks)}")
        return "; ".join(parts)


async def no_leaks(before: Census, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Wait until nothing is open or running beyond `before` (closing fds and ending
    tasks take a few loop turns, and no event marks the moment); fail with the excess."""
    deadline = time.monotonic() + timeout_s
    while True:
        leaked = before.diff(Census.take())
        if not leaked:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"leaked after the faults: {leaked}")
        await asyncio.sleep(0.02)


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll a condition no event announces (a counter inside the agent, a log entry,
    a call on the agent's worker thread); fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        await asyncio.sleep(0.01)


class FaultLauncher(AgentLauncher):
    """AgentLauncher whose agents' dependencies a test may change first."""

    async def start_with(
        self,
        change: Callable[[Parts], Parts],
        hardware: str = "t4",
        *,
        config: str | os.PathLike[str] | None = None,
        config_name: str | None = None,
        flags: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        wait_ready: bool = True,
    ) -> RunningAgent:
        return await self.start(
            hardware,
            config=config,
            config_name=config_name,
            flags=flags,
            env=env,
            wait_ready=wait_ready,
            change=change,
        )


class FlakyBackend(FakeBackend):
    """The simulated backend, whose snapshot(), probe() and wait_event() raise
    BackendError, as NVML calls failing mid-run would, while the flags are set."""

    def __init__(self, snapshot: HardwareSnapshot, events_path: str | None = None) -> None:
        super().__init__(snapshot, events_path)
        self.snapshot_fails = threading.Event()
        self.probe_fails = threading.Event()
        self.wait_fails = threading.Event()
        self.probes: list[tuple[str, bool | None]] = []  # (device, answer; None: raised)

    def snapshot(self) -> HardwareSnapshot:
        if self.snapshot_fails.is_set():
            raise BackendError("NVML: nvmlDeviceGetCount failed: GPU is lost", transient=True)
        return super().snapshot()

    def probe(self, gpu_uuid: str) -> bool:
        if self.probe_fails.is_set():
            self.probes.append((gpu_uuid, None))
            raise BackendError(f"NVML: nvmlDeviceGetMemoryInfo({gpu_uuid}) failed: Unknown")
        answer = super().probe(gpu_uuid)
        self.probes.append((gpu_uuid, answer))
        return answer

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        if self.wait_fails.is_set():
            self.wait_fails.clear()  # fails once per set
            raise BackendError("NVML: nvmlEventSetWait failed: Unknown Error")
        return super().wait_event(timeout_s)


def with_backend(backend: Callable[[], FakeBackend]) -> Callable[[Parts], Parts]:
    return lambda deps: dataclasses.replace(deps, open_backend=backend)


async def end_grpc_server(server: DevicePluginServer) -> None:
    """End a real server's gRPC server from under it, as a failure inside gRPC would:
    nothing tells the DevicePluginServer, so only its crash watch can notice."""
    grpc_server = server._server  # reaching past the adapter is the fault itself
    assert grpc_server is not None, "not serving"
    await grpc_server.stop(None)


def recorded_endpoints(endpoints: dict[str, KubeletEndpoint]) -> Callable[[Parts], Parts]:
    """Serve through the endpoints `gpuslice run` builds, keeping the latest one of
    each resource in `endpoints` so a test can reach its server."""

    def change(deps: Parts) -> Parts:
        build = deps.endpoint

        def factory(handler: ResourceHandler) -> PluginEndpoint:
            endpoint = build(handler)
            assert isinstance(endpoint, KubeletEndpoint)
            endpoints[handler.resource_name] = endpoint
            return endpoint

        return dataclasses.replace(deps, endpoint=factory)

    return change


def summary_ms(seconds: Sequence[float]) -> str:
    """median / p95 / max of durations, in milliseconds."""
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"median {statistics.median(ordered) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, "
        f"max {ordered[-1] * 1000:.1f} ms (n={len(ordered)})"
    )
