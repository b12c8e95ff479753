"""--status-socket: the probes on a unix socket of the pod's own, beside the TCP port that
two agents share under hostNetwork (SO_REUSEPORT). On the shared port a probe may reach
either agent; on each agent's socket it reaches that agent only."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from gpuslice.adapters.status_http import StatusServer
from gpuslice.core.errors import BackendError


async def get_unix(path: str, target: str) -> tuple[int, Any]:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 2.0)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def probe(name: str, ready: bool) -> Any:
    return lambda: (ready, {"agent": name})


async def test_each_agents_socket_answers_for_that_agent_while_they_share_the_port(
    tmp_path: Path,
) -> None:
    old_sock, new_sock = str(tmp_path / "old.sock"), str(tmp_path / "new.sock")
    async with StatusServer("127.0.0.1:0", probe("old", True), unix_path=old_sock) as old:
        address = f"127.0.0.1:{old.port}"  # the successor binds the same port
        async with StatusServer(address, probe("new", False), unix_path=new_sock) as new:
            assert new.port == old.port
            assert await get_unix(old_sock, "/readyz") == (200, {"ready": True, "agent": "old"})
            assert await get_unix(new_sock, "/readyz") == (503, {"ready": False, "agent": "new"})
            assert (await get_unix(new_sock, "/healthz"))[0] == 200
    assert not await asyncio.to_thread(Path(old_sock).exists)  # removed on the way out


async def test_a_stale_socket_file_is_replaced_and_anything_else_is_refused(
    tmp_path: Path,
) -> None:
    stale = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as leftover:  # a killed agent's: nobody listens
        leftover.bind(stale)
    async with StatusServer("127.0.0.1:0", probe("b", True), unix_path=stale):
        assert (await get_unix(stale, "/readyz"))[1]["agent"] == "b"
    plain = tmp_path / "plain"
    plain.write_text("mine")
    with pytest.raises(BackendError, match=r"^--status-socket .*plain: cannot listen"):
        async with StatusServer("127.0.0.1:0", probe("c", True), unix_path=str(plain)):
            pass
    assert plain.read_text() == "mine"
