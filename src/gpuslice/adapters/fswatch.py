"""Watch a directory for named entries being created, replaced or deleted.

inotify (through inotify_simple, read on the event loop with loop.add_reader)
when it works; otherwise, or on request, polling lstat() for inode and ctime.
Directories are watched rather than files, so these all show up:

- kubelet.sock re-created by a restarting kubelet: ("kubelet.sock", "created"),
- our own socket removed: ("nvidia-gpu.sock", "deleted"),
- a mounted ConfigMap updated by swapping its `..data` symlink: ("..data", "created").

A replaced entry is reported as created, and so is a file written and closed after
its creation (a slow writer: its content arrives after the create). inotify reports a
delete followed by a create separately; polling sees only the state at each tick. A directory that
does not exist yet is polled until it appears, then watched with inotify.

    async with DirWatcher(path, {"kubelet.sock"}) as watcher:
        async for name, kind in watcher:
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import NamedTuple, Protocol

import structlog

_log = structlog.get_logger()

CREATED = "created"
DELETED = "deleted"
INOTIFY = "inotify"
POLL = "poll"


class DirEvent(NamedTuple):
    name: str
    kind: str  # CREATED or DELETED


class InotifyLike(Protocol):
    """The part of inotify_simple.INotify the watcher uses."""

    def fileno(self) -> int: ...
    def add_watch(self, path: str, mask: int) -> int: ...
    def read(self, timeout: int | None = None) -> Iterable[_RawEvent]: ...
    def close(self) -> None: ...


class _RawEvent(Protocol):
    @property
    def mask(self) -> int: ...
    @property
    def name(self) -> str: ...


FileId = tuple[int, int, int]  # st_dev, st_ino, st_ctime_ns


def file_id(path: str) -> FileId | None:
    """Which file is at `path` now (None: none): a re-created file gets a new id, even
    when its inode number is reused."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _open_inotify() -> InotifyLike:
    from inotify_simple import INotify

    inotify: InotifyLike = INotify(nonblocking=True)
    return inotify


class DirWatcher:
    """Async iterator of DirEvent for entries of `path` (only `names`, if given).

    use_inotify=False forces polling; with True, polling takes over whenever
    inotify cannot be set up (no instances left, missing directory) or the watch
    is lost (directory removed). `mode` says which one is running.
    """

    def __init__(
        self,
        path: str,
        names: Iterable[str] | None = None,
        *,
        poll_interval: float = 1.0,
        use_inotify: bool = True,
        inotify_factory: Callable[[], InotifyLike] = _open_inotify,
        follow: bool = True,  # False: a link at `path` is not followed (not watched)
    ) -> None:
        self.path = path
        self._follow = follow
        self.names = None if names is None else frozenset(names)
        self.poll_interval = poll_interval
        self.mode = POLL
        self._use_inotify = use_inotify
        self._factory = inotify_factory
        self._queue: asyncio.Queue[DirEvent | None] = asyncio.Queue()
        self._seen: dict[str, FileId] = {}
        self._inotify: InotifyLike | None = None
        self._poller: asyncio.Task[None] | None = None
        self._closed = False

    async def __aenter__(self) -> DirWatcher:
        self._seen = self._scan()
        if self._use_inotify and not _is_dir(self.path):
            _log.debug("fswatch_waiting_for_directory", path=self.path)
            self._start_polling(until_present=True)
        elif not (self._use_inotify and self._start_inotify()):
            self._start_polling()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __aiter__(self) -> DirWatcher:
        return self

    async def __anext__(self) -> DirEvent:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def close(self) -> None:
        """Stop watching; a pending or later iteration ends."""
        if self._closed:
            return
        self._closed = True
        self._stop_inotify()
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        self._queue.put_nowait(None)

    # inotify

    def _start_inotify(self) -> bool:
        from inotify_simple import flags

        mask = (
            flags.CREATE
            | flags.CLOSE_WRITE  # a file written after its creation (a slow writer)
            | flags.MOVED_TO
            | flags.DELETE
            | flags.MOVED_FROM
            | flags.DELETE_SELF
            | flags.MOVE_SELF
            | flags.ONLYDIR
        )
        if not self._follow:
            mask |= flags.DONT_FOLLOW
        inotify: InotifyLike | None = None
        try:
            inotify = self._factory()
            inotify.add_watch(self.path, mask)
        except OSError as exc:
            if inotify is not None:
                inotify.close()
            _log.warning("fswatch_polling", path=self.path, reason=f"inotify unavailable: {exc}")
            return False
        self._inotify = inotify
        asyncio.get_running_loop().add_reader(inotify.fileno(), self._on_readable)
        self.mode = INOTIFY
        return True

    def _stop_inotify(self) -> None:
        inotify, self._inotify = self._inotify, None
        if inotify is not None:
            asyncio.get_running_loop().remove_reader(inotify.fileno())
            inotify.close()

    def _on_readable(self) -> None:
        from inotify_simple import flags

        inotify = self._inotify
        if inotify is None:
            return
        try:
            events = inotify.read(timeout=0)
        except BlockingIOError:
            return
        for ev in events:
            if ev.mask & flags.Q_OVERFLOW:
                self._rescan()
            elif ev.mask & (flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED):
                _log.warning("fswatch_polling", path=self.path, reason="watch lost")
                self._stop_inotify()
                self._rescan()
                self._start_polling()
                return
            elif self._wanted(ev.name):
                written = flags.CREATE | flags.CLOSE_WRITE | flags.MOVED_TO
                kind = CREATED if ev.mask & written else DELETED
                stamp = self._stat(ev.name)
                if ev.mask == flags.CLOSE_WRITE and stamp == self._seen.get(ev.name):
                    continue  # closed with nothing written since it was reported
                if stamp is None:
                    self._seen.pop(ev.name, None)
                else:
                    self._seen[ev.name] = stamp
                self._queue.put_nowait(DirEvent(ev.name, kind))

    # polling

    def _start_polling(self, *, until_present: bool = False) -> None:
        self.mode = POLL
        self._poller = asyncio.get_running_loop().create_task(self._poll(until_present))

    async def _poll(self, until_present: bool) -> None:
        """Poll; with `until_present`, only until the directory exists and inotify
        can watch it."""
        while True:
            await asyncio.sleep(self.poll_interval)
            self._rescan()
            if until_present and _is_dir(self.path):
                if self._start_inotify():
                    self._poller = None
                    self._rescan()  # what changed before the watch was in place
                    return
                until_present = False  # inotify unavailable (said once): poll on

    def _rescan(self) -> None:
        """Report the difference between the last known state and the directory now."""
        now = self._scan()
        for name in sorted(self._seen.keys() - now.keys()):
            self._queue.put_nowait(DirEvent(name, DELETED))
        for name in sorted(now):
            if self._seen.get(name) != now[name]:
                self._queue.put_nowait(DirEvent(name, CREATED))
        self._seen = now

    def _scan(self) -> dict[str, FileId]:
        if self.names is None:
            try:
                candidates: Iterable[str] = os.listdir(self.path)
            except OSError:
                return {}
        else:
            candidates = self.names
        stamps = {name: self._stat(name) for name in candidates}
        return {name: stamp for name, stamp in stamps.items() if stamp is not None}

    def _stat(self, name: str) -> FileId | None:
        return file_id(os.path.join(self.path, name))

    def _wanted(self, name: str) -> bool:
        return bool(name) and (self.names is None or name in self.names)


async def wait_for_directory(path: str, *, poll_interval: float = 1.0) -> None:
    """Return once `path` is a directory, watching its parent for it (polled while
    the parent is missing too)."""
    parent, name = _split(path)
    async with DirWatcher(parent, {name}, poll_interval=poll_interval) as watcher:
        while not _is_dir(path):
            await anext(watcher)


def _is_dir(path: str) -> bool:
    return os.path.isdir(path)


def _split(path: str) -> tuple[str, str]:
    return os.path.split(os.path.abspath(path))
