"""A directory that does not exist yet: DirWatcher polls quietly until it appears
and then watches it with inotify; wait_for_directory returns once it exists,
even when its parent is missing too."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
import structlog

from gpuslice.adapters.fswatch import (
    CREATED,
    INOTIFY,
    POLL,
    DirEvent,
    DirWatcher,
    wait_for_directory,
)


@pytest.fixture
def base() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="gsw-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _next(watcher: DirWatcher) -> DirEvent:
    async with asyncio.timeout(5):
        return await anext(watcher)


def _touch(path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("x")


async def test_a_missing_directory_is_watched_with_inotify_once_it_appears(base: str) -> None:
    later = os.path.join(base, "later")
    with structlog.testing.capture_logs() as logged:
        async with DirWatcher(later, {"kubelet.sock"}, poll_interval=0.02) as watcher:
            assert watcher.mode == POLL
            os.mkdir(later)
            _touch(os.path.join(later, "kubelet.sock"))
            assert await _next(watcher) == DirEvent("kubelet.sock", CREATED)
            assert watcher.mode == INOTIFY
            os.unlink(os.path.join(later, "kubelet.sock"))
            _touch(os.path.join(later, "kubelet.sock"))
            assert (await _next(watcher)).name == "kubelet.sock"
    assert [e for e in logged if e["log_level"] in ("warning", "error")] == []


async def test_waiting_for_a_directory_returns_once_it_exists(base: str) -> None:
    path = os.path.join(base, "kubelet", "device-plugins")  # its parent is missing too
    waiting = asyncio.create_task(wait_for_directory(path, poll_interval=0.02))
    await asyncio.sleep(0.05)  # a few polls: still waiting
    assert not waiting.done()
    os.makedirs(path)
    await asyncio.wait_for(waiting, 5)
    await asyncio.wait_for(wait_for_directory(path), 5)  # there already: at once
