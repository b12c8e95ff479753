"""A plugin is live when it answers its API, not when its socket accepts a connection:
over real unix sockets, a squatter on our socket path (it accepts and says nothing,
sends garbage, speaks HTTP/1.1, or never accepts) is replaced at start, within the
probe's deadline, while a real device plugin there is left alone (the DRA server's
sockets: test_dra_server)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from kubelet_fakes import FakeHandler, make_resource

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.deviceplugin.liveness import PROBE_S, serves_device_plugin
from gpuslice.core.ports import SocketTaken

GPU = "nvidia.com/gpu"
Squat = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # reads what comes, answers nothing, until the peer leaves
    writer.close()


async def _garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(os.urandom(4096))
    await reader.read()
    writer.close()


async def _http1(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(100)
    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    writer.close()


SQUATTERS: dict[str, Squat] = {"silent": _silent, "garbage": _garbage, "http1": _http1}


@pytest.fixture
async def squatted(request: pytest.FixtureRequest, plugin_dir: str) -> AsyncIterator[str]:
    """The resource's socket path, bound by a process that is no device plugin."""
    path = os.path.join(plugin_dir, "nvidia-gpu.sock")
    server = await asyncio.start_unix_server(SQUATTERS[request.param], path)
    try:
        yield path
    finally:
        server.close()


@pytest.mark.parametrize("squatted", list(SQUATTERS), indirect=True)
async def test_a_squatter_on_our_socket_path_is_replaced(squatted: str, plugin_dir: str) -> None:
    theirs = os.lstat(squatted).st_ino
    server = DevicePluginServer(FakeHandler(make_resource()), plugin_dir)
    started = time.monotonic()
    await server.start()  # no SocketTaken
    took = time.monotonic() - started
    try:
        assert server.socket_present()
        assert os.lstat(squatted).st_ino != theirs
        assert await serves_device_plugin(squatted)  # ours answers now
    finally:
        await server.stop()
    print(f"squatter found out and replaced in {took:.2f} s")
    assert took < PROBE_S + 1.0  # bounded by the probe's deadline


async def test_a_socket_that_never_accepts_is_no_plugin(plugin_dir: str) -> None:
    path = os.path.join(plugin_dir, "nvidia-gpu.sock")
    with socket.socket(socket.AF_UNIX) as backlog:  # listens, never accepts
        backlog.bind(path)
        backlog.listen(1)
        assert not await serves_device_plugin(path, timeout_s=0.5)


async def test_a_real_device_plugin_on_the_path_is_left_alone(plugin_dir: str) -> None:
    other = DevicePluginServer(FakeHandler(make_resource()), plugin_dir)
    await other.start()
    try:
        assert await serves_device_plugin(other.socket_path)
        server = DevicePluginServer(FakeHandler(make_resource()), plugin_dir)
        with pytest.raises(SocketTaken, match="another device plugin serves"):
            await server.start()
        assert other.socket_present()
    finally:
        await other.stop()
