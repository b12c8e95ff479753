"""Sockets in the device-plugin directory: a second agent refused (by the lock, or by
another plugin's live socket) stops without touching the first's socket or lock file;
our socket replaced by another process's (renamed over it: inotify says created, not
deleted) is noticed, and served again at once when no device plugin answers there (a
dead file, or a process that accepts and does not speak the API), or as soon as the live
plugin that answers there is gone."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from typing import Any

import pytest
from agent_harness import GPU, AgentLauncher, is_socket, registrations, serving
from faults_harness import eventually
from process_harness import AgentProcess

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.fake import load_spec
from gpuslice.core.resources import build_resources
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import ResourceSettings
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.testing.kubelet import KubeletStandin

from .invariant import answers_allocate


def listed(directory: str) -> list[str]:
    """The directory's entries, less the hidden temporary files of an atomic rewrite
    (the first agent rewrites its lock holder file while it serves)."""
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))


async def test_the_refused_second_agent_leaves_the_first_registered(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    args = ["--fake-hardware", "t4", "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock")]
    first = await AgentProcess.start(args)
    processes.append(first)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 1}), 20)
    before = listed(plugin_dir)
    second = await AgentProcess.start(args)
    processes.append(second)
    await second.wait_for_line("plugin_dir_locked_waiting", 20)
    second.signal(signal.SIGTERM)
    rc, _ = await second.wait()
    assert rc == 0, second.log
    assert listed(plugin_dir) == before
    assert is_socket(os.path.join(plugin_dir, "nvidia-gpu.sock"))
    await kubelet.restart()
    await kubelet.wait_for(lambda k: serving(k, {GPU: 1}), 20)
    (answer,) = await kubelet.allocate(GPU, [[next(iter(kubelet.devices(GPU)))]])
    assert answer.envs


async def test_a_refused_agent_stopping_leaves_the_other_plugins_socket(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    (resource,) = build_resources(load_spec("t4"), ResourceSettings())
    other = DevicePluginServer(ResourceHandler(resource, AllocateOptions()), kubelet.plugin_dir)
    await other.start()
    try:
        await other.register(kubelet.socket_path)
        await kubelet.wait_for(lambda k: serving(k, {GPU: 1}))
        theirs = os.lstat(other.socket_path)
        running = await launcher.start("t4")
        assert running.plugin.manager.registered() == {GPU: False}
        await running.shutdown()
        now = os.lstat(other.socket_path)
        assert (now.st_ino, now.st_ctime_ns) == (theirs.st_ino, theirs.st_ctime_ns)
        (answer,) = await kubelet.allocate(GPU, [[next(iter(kubelet.devices(GPU)))]])
        assert answer.envs
    finally:
        await other.stop()


async def test_our_socket_replaced_by_a_dead_socket_is_served_again_at_once(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running = await launcher.start("t4")
    await running.registered(kubelet)
    ours = running.socket("nvidia-gpu.sock")
    with socket.socket(socket.AF_UNIX) as dead:  # bound, never listening: nobody answers
        dead.bind(os.path.join(running.plugin_dir, "dead.sock"))
        placed = os.lstat(dead.getsockname()).st_ino
        os.rename(dead.getsockname(), ours)
    await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 1}), 10)
    assert os.lstat(ours).st_ino != placed
    assert running.plugin.manager.registered() == {GPU: True}
    await answers_allocate(kubelet)


async def test_our_socket_replaced_by_a_live_plugin_is_noticed_and_served_once_it_goes(
    kubelet: KubeletStandin, launcher: AgentLauncher, logged: list[dict[str, Any]]
) -> None:
    """A process answering the device-plugin API on our path is another plugin: gpuslice
    never fights one (faults.md), so it steps back, touching nothing, and serves once it
    is gone."""
    running = await launcher.start("t4")
    await running.registered(kubelet)
    ours = running.socket("nvidia-gpu.sock")
    (resource,) = build_resources(load_spec("t4"), ResourceSettings())
    other = DevicePluginServer(
        ResourceHandler(resource, AllocateOptions()), running.plugin_dir, "intruder.sock"
    )
    await other.start()
    try:
        intruder = os.lstat(other.socket_path).st_ino
        os.rename(other.socket_path, ours)  # the kubelet would now talk to the other plugin
        await eventually(
            lambda: running.plugin.manager.registered() == {GPU: False}, "stepped back"
        )
        assert any(e["event"] == "plugin_socket_in_use" for e in logged)
        assert os.lstat(ours).st_ino == intruder  # left alone while it answers
    finally:
        await other.stop()
    # its socket file stays behind, dead: found so at the next look, and replaced
    await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 1}), 15)
    assert os.lstat(ours).st_ino != intruder
    await answers_allocate(kubelet)


SQUATTER = (
    "import socket, sys, time\n"
    "s = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])\ns.listen()\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    if sys.argv[2] == 'garbage':\n"
    "        try:\n"
    "            c.sendall(bytes(range(256)) * 16)\n"
    "        except OSError:\n"
    "            pass\n"
    "    conns = globals().setdefault('conns', [])\n"
    "    conns.append(c)\n"
)


@pytest.mark.parametrize("says", ["nothing", "garbage"])
async def test_our_socket_taken_by_a_process_that_is_no_plugin_is_served_again(
    kubelet: KubeletStandin, launcher: AgentLauncher, logged: list[dict[str, Any]], says: str
) -> None:
    """A process that binds our path, accepts connections and says nothing (or sends
    garbage) does not speak the device-plugin API: the agent does not step back for it
    but binds its own socket again and registers, and Allocate is answered."""
    running = await launcher.start("t4")
    await running.registered(kubelet)
    ours = running.socket("nvidia-gpu.sock")
    theirs = os.path.join(running.plugin_dir, "squatter.sock")
    squatter = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SQUATTER, theirs, says, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert squatter.stdout is not None
        assert await squatter.stdout.readline() == b"listening\n"
        placed = os.lstat(theirs).st_ino
        os.rename(theirs, ours)
        await kubelet.wait_for(lambda k: registrations(k)[GPU] == 2 and serving(k, {GPU: 1}), 15)
        assert os.lstat(ours).st_ino != placed  # ours again, the squatter still running
        assert squatter.returncode is None
        assert running.plugin.manager.registered() == {GPU: True}
        assert not any(e["event"] == "plugin_socket_in_use" for e in logged)
        await answers_allocate(kubelet)
    finally:
        if squatter.returncode is None:
            squatter.kill()
        await squatter.wait()


async def test_stopping_never_removes_a_socket_put_over_ours(plugin_dir: str) -> None:
    """gRPC unlinks the path it bound when it stops: it binds a private name, so the
    file under the public name is removed only while it is ours."""
    (resource,) = build_resources(load_spec("t4"), ResourceSettings())
    server = DevicePluginServer(ResourceHandler(resource, AllocateOptions()), plugin_dir)
    await server.start()
    theirs = os.path.join(plugin_dir, "other.sock")
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(theirs)
        other.listen()
        os.rename(theirs, server.socket_path)
        placed = os.lstat(server.socket_path).st_ino
        await server.stop()
        assert os.lstat(server.socket_path).st_ino == placed
    assert [n for n in os.listdir(plugin_dir) if n.startswith(".gs")] == []
