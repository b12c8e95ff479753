"""Handing the device-plugin directory to a successor in a rolling update.

The kubelet keeps one client per resource and, whenever any plugin's ListAndWatch
stream ends, disconnects the resource's current client, if it has one: it closes that
client's connection, marks every device unhealthy and stops its endpoint (see the
kubelet reference). With no current client nothing happens. So the hand-over first
leaves the kubelet with none (adapters.deviceplugin.decoy), and the old agent's endpoint
serves until the successor's registration has replaced it:

1. old (stopping): unlink its socket files, still serving the connections the
   kubelet has, and release the directory's lock, keeping the streams lock
   (adapters.deviceplugin.streamlock);
2. successor (waiting for the directory's lock): take it, bind the same paths and
   serve, unregistered; register the decoy for each resource (refused, as expected),
   then mark the holder file `serving`;
3. old: once the holder file says so, end its streams and wait SETTLE_S for the kubelet
   to close its connection (adapters.deviceplugin.hangup): a hang-up means the decoy
   did not take (the kubelet dropped the old agent); none means the kubelet did nothing.
   Then release the streams lock; at once when no successor waits (one waiting holds a
   shared flock on dirlock.WAITING_FILE, however slowly a loaded machine lets it run)
   and none took the lock within ARRIVE_S;
4. successor: take the streams lock (polled every STREAMS_POLL_S on a thread, which wakes
   nothing else until it has it) and register, once; once every Register returned,
   mark the holder file `registered`;
5. old: with no hang-up seen, serve Allocate until the holder file says so
   (REGISTERED_S at most), then stop.

Each wait is bounded; a predecessor that died holds no lock. A successor that waited
TAKE_S registers anyway, and registers again if the kubelet then drops it
(frontends.deviceplugin.supervisor, StreamDropped).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Collection
from dataclasses import replace

import structlog

from gpuslice.adapters.deviceplugin.decoy import register_decoys
from gpuslice.adapters.deviceplugin.dirlock import POLL_S, DirLock, Holder, successor_waiting
from gpuslice.adapters.deviceplugin.streamlock import StreamsLock

_log = structlog.get_logger()

ARRIVE_S = 0.1  # for a successor that could not say it waits: it polls every POLL_S
SERVE_S = 5.0  # the longest the old agent keeps serving for a successor
TAKE_S = 10.0  # the longest a successor waits for the old agent's streams to end
STREAMS_POLL_S = 0.001  # an open, a non-blocking flock and a close each time
REGISTERED_S = 5.0  # the longest the old agent serves Allocate for a successor registering


class DirClaim:
    """The device-plugin directory held by this agent (see the module doc)."""

    def __init__(self, lock: DirLock, kubelet_socket: str = "") -> None:
        self._lock = lock
        self._kubelet_socket = kubelet_socket
        self._streams = StreamsLock(lock.directory)

    def take_streams(self) -> bool:
        return self._streams.try_take()

    async def decoy(self, resources: Collection[str]) -> bool:
        """Leave the kubelet with no current client for `resources` (step 2)."""
        return await register_decoys(self._lock.directory, self._kubelet_socket, resources)

    def serving(self) -> None:
        """Every resource is served: a predecessor may end its streams now."""
        self._lock.mark_serving()

    def registered(self) -> None:
        """Every resource is registered: a predecessor may stop serving now."""
        self._lock.mark_registered()

    async def wait_registered(self, wait_s: float = REGISTERED_S) -> bool:
        """(Old agent, the directory handed over) True once the holder file says the
        successor's registrations returned; False after `wait_s`."""
        me = self._lock.me
        started = time.monotonic()
        while time.monotonic() - started < wait_s:
            holder = _other(self._lock.holder_record(), me)
            if holder is not None and holder.registered:
                _log.info("successor_registered", successor=holder.describe())
                return True
            await asyncio.sleep(POLL_S)
        _log.warning("successor_not_registered", waited_s=wait_s)
        return False

    async def wait_streams(self, take_s: float = TAKE_S) -> bool:
        started = time.monotonic()
        cancelled = threading.Event()
        try:
            taken = await asyncio.to_thread(self._take, started + take_s, cancelled)
        finally:
            cancelled.set()
        if not taken:
            _log.warning("predecessor_still_streaming", waited_s=take_s)
            return False
        _log.info("streams_taken", waited_s=round(time.monotonic() - started, 3))
        return True

    def _take(self, deadline: float, cancelled: threading.Event) -> bool:
        while not self._streams.try_take():
            if time.monotonic() >= deadline or cancelled.is_set():
                return False
            time.sleep(STREAMS_POLL_S)
        return True

    async def hand_over(self, arrive_s: float = ARRIVE_S, serve_s: float = SERVE_S) -> bool:
        """Release the directory (our sockets already unlinked), keeping the streams, and
        return once a successor that took it serves; True when one took it."""
        self._streams.try_take()  # its file in place again, if a kubelet start deleted it
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
        return True

    def release(self) -> None:
        self._lock.release()
        self._streams.release()


def _other(holder: Holder | None, me: Holder) -> Holder | None:
    """`holder` when it is another process than `me`."""
    if holder is None or _who(holder) == _who(me):
        return None
    return holder


def _who(holder: Holder) -> Holder:
    return replace(holder, serving=False, registered=False)
