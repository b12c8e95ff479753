"""The unix sockets gpuslice serves the kubelet on, for both front-ends' gRPC servers.

Requests are capped at MAX_REQUEST_BYTES, the kubelet's own limit on what it receives
from us. A socket file another live plugin serves (one that answers a call of its API
within PROBE_S: `answers`) is never replaced; a connect() alone proves only that something
listens, as any process can bind the path. Anything else there (a stale file, a socket
that accepts and does not speak the API) is replaced.

gRPC binds under a private name beside the path, and the socket is then renamed into
place (`serve_renamed`): gRPC unlinks the path it bound when it stops, which would
otherwise remove whatever file then has the public name (another process's socket).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import stat
from collections.abc import Awaitable, Callable

import grpc
import structlog

_log = structlog.get_logger()

# gRPC's default receive limit, which the kubelet's plugin clients keep too: no device
# list the kubelet can take in, hence no request built from one, is larger.
MAX_REQUEST_BYTES = 4 * 1024 * 1024
SERVER_OPTIONS = (("grpc.max_receive_message_length", MAX_REQUEST_BYTES),)
PROBE_S = 2.0  # a plugin answers at once; a busy one still well within this
# (channel, timeout_s) -> the call's answer; raises grpc.aio.AioRpcError when refused
Probe = Callable[[grpc.aio.Channel, float], Awaitable[object]]
_BINDS = itertools.count()


def unix_target(path: str) -> str:
    """The gRPC address of a unix socket path."""
    return f"unix://{path}"


async def serve_renamed(server: grpc.aio.Server, path: str) -> str:
    """Start `server` on the unix socket `path`: bound under a private name beside it,
    then renamed into place (the module doc says why); returns the private name, which
    the kernel keeps as the address of the socket and of each connection it accepts.
    Raises OSError or RuntimeError, with the server stopped."""
    private = os.path.join(os.path.dirname(path), f".gs{os.getpid()}-{next(_BINDS)}")
    try:
        unlink(private)  # left by a process of ours with this PID that was killed
        server.add_insecure_port(unix_target(private))
        await server.start()
        os.rename(private, path)  # atomic: a stale file is replaced
    except (OSError, RuntimeError):
        await server.stop(None)
        raise
    return private


def unlink(path: str) -> None:
    """Remove `path`; one already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


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
