"""Which agent streams to the kubelet: an exclusive flock on `gpuslice.streams` beside
the directory's lock (adapters.deviceplugin.dirlock). An agent takes it before it
registers and keeps it until its streams have ended and the kubelet hung up on them
(adapters.deviceplugin.handover); the kernel drops it with a process that dies.

A kubelet start may delete the file while it is held: the holder takes a fresh one
before it hands over, and a lock is only had on the file in place.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

import structlog

from gpuslice.adapters.deviceplugin.dirlock import open_flag_file

_log = structlog.get_logger()

STREAMS_FILE = "gpuslice.streams"


class StreamsLock:
    def __init__(self, directory: str) -> None:
        self._path = os.path.join(directory, STREAMS_FILE)
        self._directory = directory
        self._fd: int | None = None

    def try_take(self) -> bool:
        """Hold the lock on the file in place; False while another process holds it.
        True too when the file cannot be had (nothing to coordinate with, said once)."""
        if self._fd is not None:
            if _in_place(self._fd, self._path):
                return True
            self.release()
        fd = open_flag_file(self._directory, STREAMS_FILE, os.O_RDWR | os.O_CREAT)
        if fd is None:
            _log.warning("streams_lock_unavailable", path=self._path)
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError as exc:
            os.close(fd)
            _log.warning("streams_lock_unavailable", path=self._path, error=str(exc))
            return True
        if not _in_place(fd, self._path):  # replaced between the open and the lock
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _in_place(fd: int, path: str) -> bool:
    with contextlib.suppress(OSError):
        held, there = os.fstat(fd), os.lstat(path)
        return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
    return False
