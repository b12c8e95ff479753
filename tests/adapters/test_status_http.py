"""StatusServer over a real TCP socket: /healthz, /readyz 200/503 with JSON details, 404,
a client that never sends its request does not hold up the others, and an address it
cannot listen on is one BackendError naming the flag."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuslice.adapters.status_http import StatusServer
from gpuslice.core.errors import BackendError

ANSWER_WITHIN_S = 2.0  # well below the server's 5 s wait for a request line


@dataclass
class Readiness:
    """The probe the server calls: ready or not, with details, counting calls."""

    ready: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    calls: int = 0

    def __call__(self) -> tuple[bool, dict[str, Any]]:
        self.calls += 1
        return self.ready, dict(self.details)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: Any


async def get(port: int, path: str, *, request: bytes | None = None) -> Reply:
    """One HTTP/1.1 GET, read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request or f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), ANSWER_WITHIN_S)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    assert int(headers["Content-Length"]) == len(body)
    return Reply(int(status_line.split()[1]), headers, json.loads(body))


@pytest.fixture
def readiness() -> Readiness:
    return Readiness()


@pytest.fixture
async def port(readiness: Readiness) -> AsyncIterator[int]:
    async with StatusServer("127.0.0.1:0", readiness) as server:
        yield server.port


async def test_healthz_answers_200_without_asking_readiness(
    port: int, readiness: Readiness
) -> None:
    reply = await get(port, "/healthz")
    assert reply.status == 200
    assert reply.body == {"ok": True}
    assert reply.headers["Content-Type"] == "application/json"
    assert readiness.calls == 0


async def test_readyz_is_503_with_the_details_until_ready_then_200(
    port: int, readiness: Readiness
) -> None:
    readiness.details = {"resources": {"nvidia.com/gpu": False}}
    reply = await get(port, "/readyz")
    assert reply.status == 503
    assert reply.body == {"ready": False, "resources": {"nvidia.com/gpu": False}}

    readiness.ready = True
    readiness.details = {
        "resources": {"nvidia.com/gpu": True},
        "config": {"config": "ts-4", "ok": True, "detail": "default config"},
    }
    reply = await get(port, "/readyz")
    assert reply.status == 200
    assert reply.body["ready"] is True
    assert reply.body["config"]["config"] == "ts-4"
    assert readiness.calls == 2  # asked afresh on each request


@pytest.mark.parametrize("path", ["/", "/metrics", "/readyz/extra"])
async def test_an_unknown_path_is_404_naming_the_known_ones(port: int, path: str) -> None:
    reply = await get(port, path)
    assert reply.status == 404
    assert path in reply.body["error"]
    assert "/healthz" in reply.body["error"]


async def test_a_request_line_without_a_path_is_404_not_a_crash(port: int) -> None:
    reply = await get(port, "", request=b"\r\n")
    assert reply.status == 404
    assert (await get(port, "/healthz")).status == 200


async def test_a_client_that_never_sends_a_request_does_not_block_others(port: int) -> None:
    """Each connection is served on its own: a silent one waits alone for its timeout."""
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    _, half = await asyncio.open_connection("127.0.0.1", port)
    half.write(b"GET /rea")  # a request line that never ends
    await half.drain()
    try:
        started = asyncio.get_running_loop().time()
        replies = await asyncio.gather(*(get(port, "/healthz") for _ in range(5)))
        took = asyncio.get_running_loop().time() - started
        assert [r.status for r in replies] == [200] * 5
        assert took < ANSWER_WITHIN_S
    finally:
        for _, writer in [*silent, (None, half)]:
            writer.close()


async def test_after_exit_the_port_is_closed(readiness: Readiness) -> None:
    async with StatusServer("127.0.0.1:0", readiness) as server:
        port = server.port
        assert (await get(port, "/healthz")).status == 200
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_ipv6_in_brackets_is_served(readiness: Readiness) -> None:
    try:
        server = StatusServer("[::1]:0", readiness)
        await server.__aenter__()
    except BackendError:
        pytest.skip("no IPv6 loopback here")
    try:
        reader, writer = await asyncio.open_connection("::1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        await server.__aexit__(None, None, None)


async def test_a_port_in_use_is_one_line_naming_the_flag(readiness: Readiness) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(BackendError) as caught:
            async with StatusServer(address, readiness):
                pass
    assert str(caught.value) == (
        f"--status-address (GPUSLICE_STATUS_ADDRESS) {address}: cannot listen: "
        "the port is in use (with hostNetwork: by any process on the node)"
    )


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("192.0.2.1:8080", "cannot listen: not an address of this host"),  # TEST-NET-1
        ("a" * 64 + ".example:8080", "not a valid host name"),
        ("8080", "expected host:port"),
    ],
)
async def test_an_address_it_cannot_listen_on_is_one_line(
    readiness: Readiness, address: str, why: str
) -> None:
    with pytest.raises(BackendError) as caught:
        async with StatusServer(address, readiness):
            pass
    assert str(caught.value) == f"--status-address (GPUSLICE_STATUS_ADDRESS) {address}: {why}"
