"""Handing the device-plugin directory to a successor in a rolling update.

The kubelet keeps one client per resource and, whenever any plugin's ListAndWatch
stream ends, disconnects the resource's current client: every device turns
unhealthy until a plugin registers again and sends its list (see the kubelet
reference). So the old agent keeps its streams open until its successor has
registered, and the window is then only the successor's second registration,
made the instant the kubelet cancels its first stream:

1. old (stopping): unlink its socket files, still serving the connections the
   kubelet has, and release the lock;
2. successor (waiting for the lock): take it, bind the same paths, register, and
   mark the holder file `serving`;
3. old: once the holder file says so, end its streams and stop; at once when no
   successor waits (one waiting holds a shared flock on dirlock.WAITING_FILE, however
   slowly a loaded machine lets it run) and none took the lock within ARRIVE_S;
4. the kubelet disconnects the successor's client when the old stream ends; the
   successor registers again at once (frontends.deviceplugin.supervisor, StreamDropped).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import structlog

from gpuslice.adapters.deviceplugin.dirlock import POLL_S, DirLock, Holder, successor_waiting

_log = structlog.get_logger()

ARRIVE_S = 0.1  # for a successor that could not say it waits: it polls every POLL_S
SERVE_S = 5.0  # the longest the old agent keeps serving for a successor


class DirClaim:
    """The device-plugin directory held by this agent (see the module doc)."""

    def __init__(self, lock: DirLock) -> None:
        self._lock = lock

    def serving(self) -> None:
        """Every resource is registered: a predecessor may end its streams now."""
        self._lock.mark_serving()

    async def hand_over(self, arrive_s: float = ARRIVE_S, serve_s: float = SERVE_S) -> bool:
        """Release the directory (our sockets already unlinked) and return once a
        successor that took it says it serves; True when one did."""
        me = self._lock.me
        self._lock.release()
        started = time.monotonic()
        while True:
            # Waiting first: a successor names itself in the holder file before it stops
            # saying it waits, so one that stopped waiting is found in the holder file.
            waiting = successor_waiting(self._lock.directory)
            successor = _other(self._lock.holder_record(), me)
            if successor is not None:
                break
            waited = time.monotonic() - started
            if waited >= arrive_s + serve_s or (waited >= arrive_s and not waiting):
                return False
            await asyncio.sleep(POLL_S)
        _log.info("plugin_dir_handed_over", successor=successor.describe())
        while time.monotonic() - started < arrive_s + serve_s:
            holder = _other(self._lock.holder_record(), me)
            if holder is not None and holder.serving:
                _log.info("successor_serving", successor=holder.describe())
                return True
            await asyncio.sleep(POLL_S)
        _log.warning("successor_not_serving", successor=successor.describe(), waited_s=serve_s)
        return False

    def release(self) -> None:
        self._lock.release()


def _other(holder: Holder | None, me: Holder) -> Holder | None:
    """`holder` when it is another process than `me`."""
    if holder is None or replace(holder, serving=False) == replace(me, serving=False):
        return None
    return holder
