"""One gpuslice agent per device-plugin directory.

Two agents serving one directory (two pods during a rollout) would each delete
and re-bind the other's sockets. The first one takes an exclusive flock on the
directory itself, held until it exits (the kernel drops it even on SIGKILL); a
kubelet restart may delete files in the directory but never the directory. The
holder writes who it is to `gpuslice.lock` beside the sockets, so another agent
can say who it waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from dataclasses import asdict, dataclass

import structlog

from gpuslice.adapters.fswatch import wait_for_directory
from gpuslice.core.errors import GpusliceError
from gpuslice.core.waiting import unless_stopped

_log = structlog.get_logger()

HOLDER_FILE = "gpuslice.lock"


@dataclass(frozen=True)
class Holder:
    """Who holds the lock: enough to find the process on the node."""

    pid: int
    pod: str = ""
    node: str = ""
    host: str = ""

    def describe(self) -> str:
        parts = [f"pid {self.pid}"]
        parts += [f"{k} {v}" for k, v in (("pod", self.pod), ("node", self.node)) if v]
        if self.host and self.host != self.pod:
            parts.append(f"host {self.host}")
        return ", ".join(parts)


class DirLock:
    """An exclusive, non-blocking flock on `directory`, and its holder file."""

    def __init__(self, directory: str, me: Holder) -> None:
        self.directory = directory
        self.me = me
        self._info = os.path.join(directory, HOLDER_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if free; False while another process holds it. Raises
        OSError when the directory cannot be opened."""
        if self._fd is not None:
            return True
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        self._write_holder()
        return True

    def holder(self) -> str:
        """Who holds the lock, as its holder file says."""
        holder = self._read_holder()
        return holder.describe() if holder else f"a process that left no readable {self._info}"

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):  # only ours: a later holder rewrites it
            if self._read_holder() == self.me:
                os.unlink(self._info)
        os.close(fd)

    def _write_holder(self) -> None:
        tmp = f"{self._info}.{self.me.pid}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(asdict(self.me), fh)
            os.replace(tmp, self._info)
        except OSError:  # the lock holds all the same; waiters cannot say by whom
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _read_holder(self) -> Holder | None:
        try:
            with open(self._info, encoding="utf-8") as fh:
                return Holder(**json.load(fh))
        except (OSError, ValueError, TypeError):
            return None


async def acquire(lock: DirLock, stop: asyncio.Event, poll_s: float = 0.5) -> bool:
    """Take `lock`, waiting while another agent holds it (said in one log line);
    False when `stop` is set first."""
    if lock.try_acquire():
        return True
    _log.warning(
        "plugin_dir_locked_waiting",
        path=lock.directory,
        holder=lock.holder(),
        detail="another gpuslice agent serves this device-plugin directory; "
        "waiting for it to stop before serving",
    )
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
        if not stop.is_set() and lock.try_acquire():
            _log.info("plugin_dir_lock_taken", path=lock.directory)
            return True
    return False


async def claim(directory: str, me: Holder, stop: asyncio.Event) -> DirLock | None:
    """Wait for `directory` to exist, then for its lock; None when `stop` comes first.
    Raises GpusliceError (one line) when the directory cannot be locked."""
    if not _is_dir(directory):
        _log.warning(
            "plugin_dir_missing",
            path=directory,
            detail=f"the device-plugin directory {directory} does not exist: is the hostPath "
            "volume for it mounted? Waiting for it to appear",
        )
        if await unless_stopped(wait_for_directory(directory), stop) is None:
            return None
        _log.info("plugin_dir_appeared", path=directory)
    lock = DirLock(directory, me)
    try:
        return lock if await acquire(lock, stop) else None
    except OSError as exc:
        raise GpusliceError(
            f"cannot lock the device-plugin directory {directory}: {exc.strerror or exc}"
        ) from None


def _is_dir(path: str) -> bool:
    return os.path.isdir(path)
