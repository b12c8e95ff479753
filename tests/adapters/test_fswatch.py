"""DirWatcher reports created, replaced and deleted entries with inotify and with polling."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest

from gpuslice.adapters.fswatch import CREATED, DELETED, INOTIFY, POLL, DirEvent, DirWatcher

MODES = [pytest.param(True, id="inotify"), pytest.param(False, id="poll")]


@pytest.fixture
def watched() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="gsw-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _watcher(path: str, names: set[str] | None, use_inotify: bool) -> DirWatcher:
    return DirWatcher(path, names, poll_interval=0.02, use_inotify=use_inotify)


async def _next(watcher: DirWatcher) -> DirEvent:
    async with asyncio.timeout(5):
        return await anext(watcher)


def _touch(path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("x")


@pytest.mark.parametrize("use_inotify", MODES)
async def test_mode_is_the_one_asked_for(watched: str, use_inotify: bool) -> None:
    async with _watcher(watched, None, use_inotify) as watcher:
        assert watcher.mode == (INOTIFY if use_inotify else POLL)


@pytest.mark.parametrize("use_inotify", MODES)
async def test_create_and_delete_of_a_watched_name(watched: str, use_inotify: bool) -> None:
    target = os.path.join(watched, "kubelet.sock")
    async with _watcher(watched, {"kubelet.sock"}, use_inotify) as watcher:
        _touch(os.path.join(watched, "other"))  # not watched: never reported
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(target)
        sock.close()
        assert await _next(watcher) == DirEvent("kubelet.sock", CREATED)
        os.unlink(target)
        assert await _next(watcher) == DirEvent("kubelet.sock", DELETED)


@pytest.mark.parametrize("use_inotify", MODES)
async def test_replacing_an_entry_reports_created(watched: str, use_inotify: bool) -> None:
    target = os.path.join(watched, "config.yaml")
    _touch(target)
    async with _watcher(watched, {"config.yaml"}, use_inotify) as watcher:
        _touch(target + ".new")
        os.replace(target + ".new", target)
        assert await _next(watcher) == DirEvent("config.yaml", CREATED)


@pytest.mark.parametrize("use_inotify", MODES)
async def test_configmap_data_symlink_swap(watched: str, use_inotify: bool) -> None:
    """A kubelet ConfigMap update: new ..<ts> dir, ..data_tmp symlink renamed over ..data."""
    os.mkdir(os.path.join(watched, "..2024_01"))
    os.symlink("..2024_01", os.path.join(watched, "..data"))
    async with _watcher(watched, {"..data"}, use_inotify) as watcher:
        os.mkdir(os.path.join(watched, "..2024_02"))
        os.symlink("..2024_02", os.path.join(watched, "..data_tmp"))
        os.rename(os.path.join(watched, "..data_tmp"), os.path.join(watched, "..data"))
        assert await _next(watcher) == DirEvent("..data", CREATED)
    assert os.readlink(os.path.join(watched, "..data")) == "..2024_02"


@pytest.mark.parametrize("use_inotify", MODES)
async def test_all_names_when_none_are_given(watched: str, use_inotify: bool) -> None:
    async with _watcher(watched, None, use_inotify) as watcher:
        _touch(os.path.join(watched, "a"))
        assert await _next(watcher) == DirEvent("a", CREATED)
        os.rename(os.path.join(watched, "a"), os.path.join(watched, "b"))
        seen = {await _next(watcher), await _next(watcher)}
    assert seen == {DirEvent("a", DELETED), DirEvent("b", CREATED)}


@pytest.mark.parametrize("use_inotify", MODES)
async def test_close_ends_iteration(watched: str, use_inotify: bool) -> None:
    watcher = _watcher(watched, None, use_inotify)
    async with watcher:
        pending = asyncio.ensure_future(anext(watcher))
        await watcher.close()
        with pytest.raises(StopAsyncIteration):
            await pending
    assert [e async for e in watcher] == []


async def test_falls_back_to_polling_when_inotify_cannot_start(watched: str) -> None:
    def exhausted() -> object:
        raise OSError(errno.EMFILE, "inotify instances exhausted")

    watcher = DirWatcher(watched, {"x"}, poll_interval=0.02, inotify_factory=exhausted)  # type: ignore[arg-type]
    async with watcher:
        assert watcher.mode == POLL
        _touch(os.path.join(watched, "x"))
        assert await _next(watcher) == DirEvent("x", CREATED)


async def test_missing_directory_is_polled_until_it_appears(watched: str) -> None:
    later = os.path.join(watched, "later")
    async with DirWatcher(later, {"kubelet.sock"}, poll_interval=0.02) as watcher:
        assert watcher.mode == POLL
        os.mkdir(later)
        _touch(os.path.join(later, "kubelet.sock"))
        assert await _next(watcher) == DirEvent("kubelet.sock", CREATED)


async def test_inotify_switches_to_polling_when_the_directory_goes(watched: str) -> None:
    inner = os.path.join(watched, "inner")
    os.mkdir(inner)
    _touch(os.path.join(inner, "kubelet.sock"))
    async with DirWatcher(inner, {"kubelet.sock"}, poll_interval=0.02) as watcher:
        assert watcher.mode == INOTIFY
        shutil.rmtree(inner)
        assert await _next(watcher) == DirEvent("kubelet.sock", DELETED)
        os.mkdir(inner)
        _touch(os.path.join(inner, "kubelet.sock"))
        assert await _next(watcher) == DirEvent("kubelet.sock", CREATED)
        assert watcher.mode == POLL


async def test_closing_releases_the_inotify_fd(watched: str) -> None:
    async with DirWatcher(watched, None) as watcher:
        pass
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        async with DirWatcher(watched, None) as watcher:
            assert watcher.mode == INOTIFY
    assert set(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("use_inotify", MODES)
async def test_a_file_written_after_its_creation_is_reported_again(
    watched: str, use_inotify: bool
) -> None:
    """A slow writer: the entry appears empty, its content comes later. Its create
    alone was reported before, so a config written that way was never applied."""
    path = os.path.join(watched, "config.yaml")
    async with _watcher(watched, None, use_inotify) as watcher:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            assert await _next(watcher) == DirEvent("config.yaml", CREATED)
            os.write(fd, b"version: v1\n")
        finally:
            os.close(fd)
        assert await _next(watcher) == DirEvent("config.yaml", CREATED)
