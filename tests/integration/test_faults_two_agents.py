"""Two plugins on one device-plugin directory, and a directory that is not there.

A second `gpuslice run` (a rollout's new pod) waits for the first one's lock and
says who holds it, touching nothing, then serves once the first one exits. A
socket another plugin serves (NVIDIA's plugin, which takes no lock) is left
alone until that plugin goes. A missing directory is named in one line and
served once it appears."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from agent_harness import (
    EXAMPLES,
    GPU,
    AgentLauncher,
    registrations,
    remove_dir,
    serving,
    short_dir,
)
from conftest import Logged
from process_harness import AgentProcess, clean_env

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.fake import load_spec
from gpuslice.core.resources import build_resources
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import ResourceSettings
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.testing.kubelet import KubeletStandin

C_CORE_LINE = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d")  # gRPC's own log format


def _stamp(path: str) -> tuple[int, int]:
    st = os.lstat(path)
    return (st.st_ino, st.st_ctime_ns)


async def _agent(
    processes: list[AgentProcess], plugin_dir: str, pod: str, *args: str
) -> AgentProcess:
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    argv = ["--fake-hardware", "t4x4", *args, "--kubelet-socket", kubelet_socket]
    proc = await AgentProcess.start(argv, env=clean_env(POD_NAME=pod))
    processes.append(proc)
    return proc


async def test_a_second_agent_waits_for_the_first_and_serves_once_it_exits(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    first = await _agent(processes, plugin_dir, "gpuslice-old")
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}), 15)
    socket_path = os.path.join(plugin_dir, "nvidia-gpu.sock")
    served = _stamp(socket_path)

    second = await _agent(processes, plugin_dir, "gpuslice-new")
    line = await second.wait_for_line("plugin_dir_locked_waiting", 15)
    assert f"pid {first.proc.pid}, pod gpuslice-old" in line
    assert plugin_dir in line
    with pytest.raises(TimeoutError):  # a bounded check that the second one does nothing
        await kubelet.wait_for(lambda k: len(k.registrations) > 1, 1.0)
    assert _stamp(socket_path) == served
    assert serving(kubelet, {GPU: 4})

    first.signal(signal.SIGTERM)
    rc, _ = await first.wait()
    assert rc == 0, first.log
    exited = time.monotonic()
    # The hand-over: the second serves and registers a decoy the kubelet refuses, the
    # first ends its streams (nothing happens), then the second registers, once
    # (docs/upgrades.md).
    await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 4}), 15)
    print(f"first agent exited -> second registered in {time.monotonic() - exited:.2f} s")
    assert kubelet.stale_streams == []
    assert kubelet.disconnects == []
    assert [r.accepted for r in kubelet.registrations] == [True, False, True]
    assert sum("plugin_dir_locked_waiting" in line for line in second.lines) == 1
    assert not any("stream_dropped_registering_again" in line for line in second.lines)

    second.signal(signal.SIGTERM)
    rc, _ = await second.wait()
    assert rc == 0, second.log
    assert "Traceback" not in first.log + second.log


async def test_a_socket_another_plugin_serves_is_left_alone_until_that_plugin_goes(
    kubelet: KubeletStandin, launcher: AgentLauncher, logged: Logged
) -> None:
    (resource,) = build_resources(load_spec("t4x4"), ResourceSettings())  # 4 whole GPUs
    other = DevicePluginServer(ResourceHandler(resource, AllocateOptions()), kubelet.plugin_dir)
    await other.start()
    await other.register(kubelet.socket_path)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 4}))
    socket_path = other.socket_path
    theirs = _stamp(socket_path)

    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    assert running.plugin.manager.registered() == {GPU: False}
    assert _stamp(socket_path) == theirs  # not deleted, not replaced
    (said,) = [e for e in logged if e["event"] == "plugin_socket_in_use"]
    assert said["resource"] == GPU
    assert f"another device plugin serves {GPU} on {socket_path}" in said["error"]
    assert registrations(kubelet)[GPU] == 1
    assert serving(kubelet, {GPU: 4})

    await other.stop()  # the other plugin goes, removing its socket
    gone = time.monotonic()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 16}) and registrations(k)[GPU] == 2)
    print(f"other plugin gone -> served and registered in {time.monotonic() - gone:.3f} s")
    assert running.plugin.manager.registered() == {GPU: True}
    assert running.plugin.manager.server_failures == 0
    assert kubelet.stale_streams == []


async def test_a_missing_plugin_directory_is_named_once_and_served_once_it_appears(
    processes: list[AgentProcess],
) -> None:
    base = short_dir("gsd-")
    late = os.path.join(base, "device-plugins")
    try:
        proc = await AgentProcess.start(
            ["--fake-hardware", "t4", "--kubelet-socket", os.path.join(late, "kubelet.sock")]
        )
        processes.append(proc)
        line = await proc.wait_for_line("plugin_dir_missing", 15)
        assert f"the device-plugin directory {late} does not exist" in line
        assert "is the hostPath volume for it mounted?" in line

        os.mkdir(late)
        created = time.monotonic()
        async with KubeletStandin(late) as kubelet:
            await kubelet.wait_for(lambda k: serving(k, {GPU: 1}), 15)
            took = time.monotonic() - created
            print(f"directory created -> registered in {took:.2f} s (kubelet started at once)")
            proc.signal(signal.SIGTERM)
            rc, _ = await proc.wait()
        assert rc == 0, proc.log
        assert sum("plugin_dir_missing" in line for line in proc.lines) == 1
        noise = ("fswatch_polling", "plugin_server_failed", "failed 6 times", "Traceback")
        assert [line for line in proc.lines if any(n in line for n in noise)] == []
        assert [line for line in proc.lines if C_CORE_LINE.match(line)] == []
    finally:
        remove_dir(base)
