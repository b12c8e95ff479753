"""One gpuslice agent per device-plugin directory.

Two agents serving one directory (two pods during a rollout) would each delete
and re-bind the other's sockets. The first one takes an exclusive flock on the
directory itself, held until it exits (the kernel drops it even on SIGKILL); a
kubelet restart may delete files in the directory but never the directory. The
holder writes who it is to `gpuslice.lock` beside the sockets, so another agent
can say who it waits for.

A successor started while the old agent runs (a rolling update with maxSurge)
waits for the lock, polling often enough to take over within a few milliseconds
of the old agent letting go (docs/upgrades.md). While it waits it holds a
shared flock on `gpuslice.waiting` beside the lock, which the kernel drops with the
process: the old agent asks `successor_waiting` whether one is there, rather than
guessing from how soon it takes the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import structlog

from gpuslice.adapters.fswatch import wait_for_directory
from gpuslice.adapters.outside_files import read_bytes, write_in_dir
from gpuslice.core.errors import GpusliceError
from gpuslice.core.waiting import unless_stopped

_log = structlog.get_logger()

HOLDER_FILE = "gpuslice.lock"
WAITING_FILE = "gpuslice.waiting"  # shared-locked by each agent waiting for the lock
HOLDER_MAX_BYTES = 4096  # a pid and three names
POLL_S = 0.01  # while waiting: an open, a non-blocking flock and a close each time
Waiting = Callable[[str], None]  # told who holds the lock, once, when it must wait


@dataclass(frozen=True)
class Holder:
    """Who holds the lock: enough to find the process on the node."""

    pid: int
    pod: str = ""
    node: str = ""
    host: str = ""
    token: str = ""  # this process, where PIDs of two pods' namespaces may be equal
    serving: bool = False  # it serves every resource, ready to register (a predecessor waits)
    # Its registrations returned: the kubelet's endpoints are its own (a predecessor stops).
    # Written only once true: an earlier version, which refuses a field it does not know,
    # reads the file only before that.
    registered: bool = False

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

    def holder_record(self) -> Holder | None:
        """The holder file's record, whoever wrote it (None: none readable)."""
        return self._read_holder()

    def mark_serving(self) -> None:
        """Say in the holder file that we serve (while we hold the lock)."""
        if self._fd is not None:
            self.me = replace(self.me, serving=True)
            self._write_holder()

    def mark_registered(self) -> None:
        """Say in the holder file that our registrations returned (while we hold the lock)."""
        if self._fd is not None:
            self.me = replace(self.me, registered=True)
            self._write_holder()

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):  # only ours: a later holder rewrites it
            if self._read_holder(fd) == self.me:
                os.unlink(HOLDER_FILE, dir_fd=fd)
        os.close(fd)

    def _write_holder(self) -> None:
        """Written relative to the locked directory's fd, through a temporary file with
        an unpredictable name created O_EXCL|O_NOFOLLOW: a link planted there is never
        followed."""
        assert self._fd is not None
        with contextlib.suppress(OSError):  # the lock holds; waiters cannot say by whom
            fields = asdict(self.me)
            if not self.me.registered:
                del fields["registered"]
            write_in_dir(self._fd, HOLDER_FILE, json.dumps(fields), durable=False)

    def _read_holder(self, dir_fd: int | None = None) -> Holder | None:
        """The holder file's content: a regular file of at most HOLDER_MAX_BYTES, not
        through a link; None for anything else."""
        try:
            if dir_fd is None:
                data = read_bytes(self._info, limit=HOLDER_MAX_BYTES, follow=False)
            else:
                data = read_bytes(HOLDER_FILE, limit=HOLDER_MAX_BYTES, follow=False, dir_fd=dir_fd)
            fields = json.loads(data)
            holder = Holder(**fields)
        except (OSError, ValueError, TypeError, RecursionError):
            return None
        if not isinstance(holder.pid, int) or not all(
            isinstance(v, str) for v in (holder.pod, holder.node, holder.host)
        ):
            return None
        return holder


async def acquire(
    lock: DirLock, stop: asyncio.Event, poll_s: float = POLL_S, waiting: Waiting | None = None
) -> bool:
    """Take `lock`, waiting while another agent holds it (said in one log line and
    to `waiting`); False when `stop` is set first."""
    if lock.try_acquire():
        return True
    holder = lock.holder()
    _log.warning(
        "plugin_dir_locked_waiting",
        path=lock.directory,
        holder=holder,
        detail="another gpuslice agent serves this device-plugin directory; "
        "waiting for it to stop before serving",
    )
    if waiting is not None:
        waiting(holder)
    announced = _announce_waiting(lock.directory)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_s)
            if not stop.is_set() and lock.try_acquire():
                _log.info("plugin_dir_lock_taken", path=lock.directory)
                return True
        return False
    finally:  # after the holder file names us: a predecessor looks there next
        if announced is not None:
            _withdraw(lock.directory, announced)


def open_flag_file(directory: str, name: str, flags: int) -> int | None:
    """The fd of a file that carries only a flock: a regular file, never through a link;
    None otherwise."""
    try:
        fd = os.open(
            os.path.join(directory, name),
            flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o644,
        )
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _announce_waiting(directory: str) -> int | None:
    """Hold a shared flock on the waiting file while waiting (None: it cannot be had, and
    a predecessor then looks for a successor only briefly)."""
    fd = open_flag_file(directory, WAITING_FILE, os.O_RDWR | os.O_CREAT)
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
    return fd


def _withdraw(directory: str, fd: int) -> None:
    """Stop waiting: the last waiter removes the waiting file (when no other holds it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, WAITING_FILE))
    except OSError:
        pass  # another agent waits too: the file is its now
    finally:
        os.close(fd)


def successor_waiting(directory: str) -> bool:
    """True while another agent waits for the directory's lock (it holds the waiting
    file's shared flock: a process that died holds nothing)."""
    fd = open_flag_file(directory, WAITING_FILE, os.O_RDONLY)
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


async def claim(
    directory: str, me: Holder, stop: asyncio.Event, waiting: Waiting | None = None
) -> DirLock | None:
    """Wait for `directory` to exist, then for its lock; None when `stop` comes first.
    Raises GpusliceError (one line) when the directory cannot be locked."""
    if not await directory_present(directory, stop):
        return None
    lock = DirLock(directory, me)
    try:
        return lock if await acquire(lock, stop, waiting=waiting) else None
    except OSError as exc:
        raise GpusliceError(
            f"cannot lock the device-plugin directory {directory}: {exc.strerror or exc}"
        ) from None


async def directory_present(directory: str, stop: asyncio.Event) -> bool:
    """Wait for `directory` to exist (said in one log line); False when `stop` comes first."""
    if not _is_dir(directory):
        _log.warning(
            "plugin_dir_missing",
            path=directory,
            detail=f"the device-plugin directory {directory} does not exist: is the hostPath "
            "volume for it mounted? Waiting for it to appear",
        )
        if await unless_stopped(wait_for_directory(directory), stop) is None:
            return False
        _log.info("plugin_dir_appeared", path=directory)
    return True


def _is_dir(path: str) -> bool:
    return os.path.isdir(path)
