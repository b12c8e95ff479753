"""Whether the kubelet hung up on a device-plugin server, as the kernel lists sockets.

When a plugin's ListAndWatch stream ends, the kubelet disconnects the resource's current
client: it closes that client's connection, then marks every device unhealthy, in one
goroutine (see the kubelet reference). A plugin that ended its streams, as the current
client, knows the kubelet has dropped it once a connection to its server closes. Each
server binds a name of its own (adapters.kubelet_socket.serve_renamed), so its accepted
connections are the lines of /proc/net/unix that carry that name and do not listen.
The table is polled on a thread of its own, off the event loop and without waking it
until the answer is in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gpuslice.adapters.outside_files import read_bytes

UNIX_TABLE = "/proc/net/unix"
TABLE_MAX_BYTES = 32 * 1024 * 1024  # some 250,000 sockets
POLL_S = 0.002
_LISTENING = 0x10000  # __SO_ACCEPTCON in the Flags column


def connections(bound: str, table: str = UNIX_TABLE) -> frozenset[int] | None:
    """The inodes of the connected sockets a server bound at `bound` accepted; None when
    the table cannot be read."""
    try:
        data = read_bytes(table, limit=TABLE_MAX_BYTES)
    except OSError:
        return None
    name = bound.lstrip("/").encode()
    found: set[int] = set()
    for line in data.splitlines()[1:]:
        fields = line.split(maxsplit=7)
        if len(fields) != 8 or fields[7].lstrip(b"/") != name:
            continue
        try:
            if not int(fields[3], 16) & _LISTENING:
                found.add(int(fields[6]))
        except ValueError:
            continue
    return frozenset(found)


async def wait_hung_up(
    bound: str, timeout_s: float, end: Callable[[], None], table: str = UNIX_TABLE
) -> bool:
    """Call `end` (which ends the streams), then return True once one connection the
    server bound at `bound` had before is closed, or at once when it had none; False
    after `timeout_s`, or when the table is unreadable."""
    before = await asyncio.to_thread(connections, bound, table)
    end()
    if not before:
        return before is not None
    return await asyncio.to_thread(_closed, bound, before, time.monotonic() + timeout_s, table)


def _closed(bound: str, before: frozenset[int], deadline: float, table: str) -> bool:
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = connections(bound, table)
        if now is None:
            return False
        if before - now:
            return True
    return False
