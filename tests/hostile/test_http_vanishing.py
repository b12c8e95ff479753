"""Clients of the status endpoint that vanish mid-exchange, over real TCP sockets: each
sends a request and leaves before reading the reply (a FIN, a reset, a half-close).
Each is that client's problem only: one debug line, no "Unhandled exception" from the
loop and no traceback, and the endpoint keeps answering."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from faults_harness import eventually

from gpuslice.adapters.status_http import MAX_LINE, StatusServer

TOO_LONG = b"GET /" + b"a" * (MAX_LINE + 100) + b" HTTP/1.1\r\n\r\n"  # answered 414
NOT_FOUND = b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n"  # answered 404
UNFINISHED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # headers never end


def _ready() -> tuple[bool, dict[str, object]]:
    return True, {}


def _close(sock: socket.socket) -> None:
    sock.close()


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _shutdown(sock: socket.socket) -> None:
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _half_close(sock: socket.socket) -> None:
    sock.shutdown(socket.SHUT_WR)  # keeps reading, but never does
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


LEAVE: dict[str, Callable[[socket.socket], None]] = {
    "close": _close,
    "reset": _reset,
    "shutdown": _shutdown,
    "half-close-then-reset": _half_close,
}


async def _vanish(port: int, request: bytes, leave: Callable[[socket.socket], None]) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    with contextlib.suppress(ConnectionError):  # refused mid-way and reset: gone already
        await loop.sock_sendall(sock, request)
    leave(sock)


async def _healthz(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return raw


@pytest.mark.parametrize("leave", list(LEAVE), ids=list(LEAVE))
@pytest.mark.parametrize(
    "request_bytes", [TOO_LONG, NOT_FOUND, UNFINISHED], ids=["414", "404", "unfinished"]
)
async def test_a_client_that_leaves_before_the_reply_is_one_debug_line(
    leave: str, request_bytes: bytes
) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        with structlog.testing.capture_logs() as logged:
            async with StatusServer("127.0.0.1:0", _ready, timeout_s=0.5) as srv:
                for _ in range(20):
                    await _vanish(srv.port, request_bytes, LEAVE[leave])
                # Accepted in order: each of them is in the server's hands before this.
                assert b" 200 OK" in await _healthz(srv.port)
                await eventually(lambda: srv.open_connections == 0, "every client closed")
                assert b" 200 OK" in await _healthz(srv.port)  # still serving
    finally:
        loop.set_exception_handler(None)
    assert [str(context.get("message")) for context in unhandled] == []
    status = [entry for entry in logged if entry["event"] != "status_serving"]
    assert {entry["log_level"] for entry in status} <= {"debug"}
    assert all(entry["event"] == "status_client_gone" for entry in status)
    assert all("\n" not in str(value) for entry in status for value in entry.values())
