"""A rolling upgrade with a successor started beside the old agent (DaemonSet maxSurge),
as real `gpuslice run` processes against the kubelet stand-in, which keeps a resource's
current client as the kubelet does (a Register call makes its client current before
dialling it, a failed connection removes it, and a stream that ends disconnects the
current client, if any).

The successor shares the status port (hostNetwork), reports ready while it waits for
the device-plugin directory, then serves unregistered while the old agent still streams
and registers a decoy the kubelet refuses, which leaves it no current client; the old
agent ends its streams (nothing happens), the successor registers once, and the old
agent serves Allocate until that returned: no pod is refused and allocatable never reads
0. Where the decoy does not take (a kubelet that makes a client current only once
connected) the old agent is dropped and the successor registers after that, as before
(docs/upgrades.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import AsyncIterator

import pytest
from agent_harness import GPU, AgentLauncher, registrations, serving
from process_harness import AgentProcess, clean_env, http_json

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.fake import load_spec
from gpuslice.core.resources import build_resources
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import ResourceSettings
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

PERIOD_S = 0.05
# Each wait below is for a state; this only bounds a hang, far beyond what an agent
# starting on a loaded 2-core machine takes (the test's own timeout is above it).
HANG_S = 60.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _agent(
    processes: list[AgentProcess], plugin_dir: str, pod: str, *args: str
) -> AgentProcess:
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    argv = ["--fake-hardware", "t4x4", "--kubelet-socket", kubelet_socket, *args]
    proc = await AgentProcess.start(argv, env=clean_env(POD_NAME=pod))
    processes.append(proc)
    return proc


class _Admissions:
    """A pod admitted (then released) every PERIOD_S, its outcome kept; and how long
    allocatable was 0, as seen at each admission tick."""

    def __init__(self, kubelet: KubeletStandin) -> None:
        self.kubelet = kubelet
        self.admitted = 0
        self.failed: list[str] = []
        self.stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()  # set, and replaced, at each admission

    def start(self) -> None:
        self._task = asyncio.create_task(self.run())

    async def finish(self) -> None:
        self.stop.set()
        assert self._task is not None
        await self._task

    async def until_admitted(self, count: int) -> None:
        """Until `count` pods were admitted in all, however long a loaded machine takes
        (the test's timeout bounds it); what ended the admissions first is raised."""
        task = self._task
        assert task is not None
        while self.admitted < count:
            progress = asyncio.ensure_future(self._progress.wait())
            await asyncio.wait({progress, task}, return_when=asyncio.FIRST_COMPLETED)
            progress.cancel()
            if task.done():
                task.result()
                raise AssertionError(f"admissions ended at {self.admitted}: {self.failed}")

    async def run(self) -> None:
        while not self.stop.is_set():
            pod = f"pod-{self.admitted + len(self.failed)}"
            try:
                await self.kubelet.admit(pod, {"main": {GPU: 1}})
            except AdmissionError as exc:
                self.failed.append(f"{pod}: {exc}")
            else:
                self.admitted += 1
                progress, self._progress = self._progress, asyncio.Event()
                progress.set()
                await self.kubelet.release(pod)
            # PERIOD_S between admissions, never back to back to catch up after a slow
            # one: a window of allocatable 0 sees at most one per PERIOD_S.
            await asyncio.sleep(PERIOD_S)


class _Allocatable:
    """The lowest allocatable of GPU the stand-in showed, read at each change of its state."""

    def __init__(self, kubelet: KubeletStandin) -> None:
        self.lowest: int | None = None

        def seen(k: KubeletStandin) -> bool:
            now = k.node_status().allocatable.get(GPU, 0)
            self.lowest = now if self.lowest is None else min(self.lowest, now)
            return False

        self._task = asyncio.create_task(kubelet.wait_for(seen, 100 * HANG_S))

    async def finish(self) -> int | None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return self.lowest


async def _roll(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> tuple[AgentProcess, AgentProcess, _Admissions, int | None, float]:
    """Start an agent, admit pods throughout, start its successor, stop the agent, and
    return once the successor serves and a few more pods went to it."""
    port = _free_port()
    status = ("--status-address", f"127.0.0.1:{port}")
    old = await _agent(processes, plugin_dir, "gpuslice-old", *status)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}), HANG_S)
    pods = _Admissions(kubelet)
    pods.start()

    new = await _agent(processes, plugin_dir, "gpuslice-new", *status)
    await new.wait_for_line("plugin_dir_locked_waiting", HANG_S)
    # Both listen on the port (SO_REUSEPORT); the kernel spreads connections over them.
    answers = [await http_json(port, "/readyz", HANG_S) for _ in range(40)]
    assert {code for code, _ in answers} == {200}
    plugin = [body["device-plugin"] for _, body in answers]
    waiting = [p["waiting"] for p in plugin if "waiting" in p]
    assert waiting, "no /readyz answer came from the successor"
    assert f"pid {old.proc.pid}, pod gpuslice-old" in str(waiting[0])
    assert registrations(kubelet)[GPU] == 1  # the successor waits, touching nothing

    allocatable = _Allocatable(kubelet)
    old.signal(signal.SIGTERM)
    rc, _ = await old.wait(HANG_S)
    assert rc == 0, old.log
    gone = time.monotonic()
    await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 4}), HANG_S)
    print(f"old agent exited -> successor serving in {time.monotonic() - gone:.3f} s")
    await pods.until_admitted(pods.admitted + 5)  # a few more with the successor alone
    await pods.finish()
    lowest = await allocatable.finish()
    gap = kubelet.unserved_s(GPU)
    print(f"allocatable 0 for {gap * 1000:.1f} ms, at least {lowest}; "
          f"failed: {pods.failed}")  # fmt: skip
    assert registrations(kubelet)[GPU] == 2
    assert pods.admitted > 10
    code, body = await http_json(port, "/readyz", HANG_S)
    assert (code, "waiting" in body["device-plugin"]) == (200, False)
    new.signal(signal.SIGTERM)
    rc, _ = await new.wait(HANG_S)
    assert rc == 0, new.log
    assert "Traceback" not in old.log + new.log
    return old, new, pods, lowest, gap


def _count(proc: AgentProcess, event: str) -> int:
    return sum(f"event='{event}'" in line for line in proc.lines)


@pytest.mark.timeout(4 * HANG_S)
async def test_an_upgrade_under_load_refuses_no_pod_and_never_zeroes_allocatable(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    """The successor's decoy leaves the kubelet no current client: the old agent's
    streams end with nothing done, its endpoint serves Allocate until the successor's
    one registration returned, and no pod admitted every PERIOD_S meets a gap."""
    old, new, pods, lowest, gap = await _roll(kubelet, plugin_dir, processes)
    assert pods.failed == []
    assert (lowest, gap) == (4, 0.0)
    assert kubelet.disconnects[:-1] == []  # the last: the successor's own stop
    assert kubelet.stale_streams == []
    first, decoy, second = [r for r in kubelet.registrations if r.resource == GPU]
    assert (first.accepted, decoy.accepted, second.accepted) == (True, False, True)
    assert "failed to get device plugin options" in decoy.error
    assert second.endpoint == first.endpoint != decoy.endpoint
    # Each step said once: the decoy refused, as expected; the old agent's streams ended
    # with no hang-up (the settle); the successor's registration seen by the old agent.
    assert _count(new, "decoy_refused_as_expected") == 1
    assert _count(new, "register_failed") == _count(new, "decoy_failed") == 0
    (handed,) = [line for line in old.lines if "event='streams_handed_over'" in line]
    assert f"settled=['{GPU}']" in handed
    assert "hung_up=[]" in handed
    assert _count(old, "successor_registered") == 1
    assert _count(old, "successor_not_registered") == 0
    assert _count(new, "stream_dropped_registering_again") == 0


@pytest.fixture
async def connect_first(plugin_dir: str) -> AsyncIterator[KubeletStandin]:
    """A stand-in whose Register makes a client current only once it connected."""
    async with KubeletStandin(plugin_dir, register_after_connect=True) as standin:
        yield standin


@pytest.mark.timeout(4 * HANG_S)
async def test_an_upgrade_hands_over_as_before_where_the_decoy_does_not_take(
    connect_first: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    """A kubelet that makes a client current only once connected keeps the old agent as
    current through the decoy: the old agent's stream end drops it (a hang-up, seen
    within the settle), and the successor registers once after that. Allocatable is 0
    only from that drop to the successor's first list."""
    kubelet = connect_first
    old, new, pods, _, gap = await _roll(kubelet, plugin_dir, processes)
    old_reg, new_reg = [r.at for r in kubelet.registrations if r.resource == GPU and r.accepted]
    dropped, _ = kubelet.disconnects  # the old agent's, then the successor's own stop
    assert old_reg < dropped.at < new_reg
    assert dropped.ended == dropped.dropped
    assert kubelet.stale_streams == []
    (handed,) = [line for line in old.lines if "event='streams_handed_over'" in line]
    assert f"hung_up=['{GPU}']" in handed
    assert "settled=[]" in handed
    assert _count(old, "successor_registered") == 0  # dropped: nothing to serve for
    assert _count(new, "decoy_refused_as_expected") == 1
    # Only a pod admitted inside that window can fail: for want of healthy devices, or
    # (one at most) with its Allocate in flight as the kubelet dropped the old agent.
    assert len(pods.failed) <= 2 + int(gap / PERIOD_S), pods.failed
    cut = [f for f in pods.failed if "the client connection is closing" in f]
    assert len(cut) <= 1, pods.failed
    assert all("no healthy devices present" in f for f in pods.failed if f not in cut)


async def test_an_agent_the_kubelet_drops_registers_again_at_once(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    """An older plugin of the resource still streams when the agent registers; when it
    ends, the stand-in (as the kubelet) drops the agent's client and cancels its stream,
    kubelet.sock unchanged: the agent registers again at once, with no restart."""
    (resource,) = build_resources(load_spec("t4x4"), ResourceSettings())
    handler = ResourceHandler(resource, AllocateOptions())
    other = DevicePluginServer(handler, kubelet.plugin_dir, "other-gpu.sock")
    await other.start()
    await other.register(kubelet.socket_path)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}))
    running = await launcher.start("t4x4")
    await kubelet.wait_for(lambda k: k.endpoint(GPU) == "nvidia-gpu.sock")

    await other.stop()  # the older stream ends
    await kubelet.wait_for(lambda k: len(k.stale_streams) == 1 and registrations(k)[GPU] == 3)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}))
    assert kubelet.endpoint(GPU) == "nvidia-gpu.sock"
    assert running.plugin.manager.server_failures == 0
    assert running.plugin.manager.registered() == {GPU: True}
    await kubelet.admit("pod", {"main": {GPU: 1}})


async def test_an_agent_whose_predecessor_was_killed_registers_without_waiting(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    """A predecessor that died holds neither lock: the next agent takes the directory
    and the streams at once and registers, holding nothing back."""
    old = await _agent(processes, plugin_dir, "gpuslice-old")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}), HANG_S)
    old.signal(signal.SIGKILL)
    await old.wait(HANG_S)
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 0, HANG_S)

    new = await _agent(processes, plugin_dir, "gpuslice-new")
    await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 4}), HANG_S)
    held = ("plugin_dir_locked_waiting", "registration_held", "predecessor_still_streaming")
    assert [line for line in new.lines if any(h in line for h in held)] == []
    new.signal(signal.SIGTERM)
    rc, _ = await new.wait(HANG_S)
    assert rc == 0, new.log


async def test_an_agent_with_no_successor_stops_without_waiting_for_the_kubelet(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    """A plain stop (no successor waits) ends the streams at once: nothing is handed
    over and no hang-up is waited for."""
    agent = await _agent(processes, plugin_dir, "gpuslice-only")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}), HANG_S)
    agent.signal(signal.SIGTERM)
    sent = time.monotonic()
    rc, _ = await agent.wait(HANG_S)
    print(f"SIGTERM -> exited in {time.monotonic() - sent:.3f} s")
    assert rc == 0, agent.log
    waited = ("plugin_dir_handed_over", "streams_handed_over", "kubelet_not_hung_up")
    assert [line for line in agent.lines if any(w in line for w in waited)] == []
    await kubelet.wait_for(lambda k: k.node_status().allocatable[GPU] == 0, HANG_S)
