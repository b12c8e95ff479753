"""Whether a live plugin serves a unix socket, proven with its own API.

A connect() that succeeds proves only that something listens: any process can bind the
path of our socket. A plugin is live when it answers a call of its API within PROBE_S;
a socket that accepts and says nothing, sends garbage, or speaks another protocol is not
one, and its file is ours to replace.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Awaitable, Callable

import grpc
import structlog

from gpuslice.adapters.deviceplugin.api import pb, pb_grpc, unix_target

_log = structlog.get_logger()

PROBE_S = 2.0  # a plugin answers its options at once; a busy one still well within this
# (channel, timeout_s) -> the call's answer; raises grpc.aio.AioRpcError when refused
Probe = Callable[[grpc.aio.Channel, float], Awaitable[object]]


async def serves_device_plugin(path: str, timeout_s: float = PROBE_S) -> bool:
    """True when a device plugin answers GetDevicePluginOptions on `path`."""

    async def options(channel: grpc.aio.Channel, deadline_s: float) -> object:
        stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
        return await stub.GetDevicePluginOptions(pb.Empty(), timeout=deadline_s)

    return await answers(path, options, timeout_s)


async def answers(path: str, probe: Probe, timeout_s: float = PROBE_S) -> bool:
    """True when the gRPC call `probe` succeeds on the unix socket at `path` within
    `timeout_s`; False at once when no process listens there."""
    if not accepts_connections(path):
        return False
    async with grpc.aio.insecure_channel(unix_target(path)) as channel:
        try:
            await probe(channel, timeout_s)
        except grpc.aio.AioRpcError as exc:
            _log.info("socket_not_a_plugin", socket=path, code=exc.code().name)
            return False
    return True


def accepts_connections(path: str) -> bool:
    """True when a live process listens on the unix socket at `path` (a stale file
    left by a process that died refuses the connection)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # absent, or not ours to look at: binding says why
        return False
    if not stat.S_ISSOCK(mode):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(path)
        except BlockingIOError:  # its backlog is full: it listens all the same
            return True
        except OSError:
            return False
    return True
