"""Where configs come from: a source of named entries for the config manager.

Three sources, one contract: a mounted ConfigMap directory (its files, updated by the
kubelet's `..data` symlink swap), the ConfigMap itself, read and watched through the
API, and the one config file (`FileEntries`: one entry, read again only on reload).
`changes()` opens the source (for the API, after its first full read) and yields a cause
each time the entries or the trouble may have changed; `read(use)` hands `use` one
consistent view of the entries; `trouble` says why the entries may be stale (the watch is
failing and is retried), None when they are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

import structlog

from gpuslice.config.loader import LoadedConfig, config_dir_entries, load_config, load_config_file
from gpuslice.core.errors import ConfigError, GpusliceError
from gpuslice.core.ports import ConfigMapView, DirWatch

log = structlog.get_logger("gpuslice.config")

T = TypeVar("T")
DATA_LINK = "..data"  # the symlink the kubelet swaps on each ConfigMap update
READ_ATTEMPTS = 3
# The ConfigMap annotation naming the default config when the API is the source: a
# `helm upgrade --set config.default=X` (or kubectl annotate) changes it live.
DEFAULT_ANNOTATION = "gpuslice.io/default-config"


@dataclass(frozen=True)
class Entries:
    """The named configs of a source at one moment."""

    names: tuple[str, ...]
    load: Callable[[str], LoadedConfig]  # one entry, loaded and checked; raises ConfigError
    where: str  # the directory, or "ConfigMap <namespace>/<name>"
    default: str | None = None  # the default config the source itself names


class EntryRejected(ConfigError):  # noqa: N818 - a state, as ConfigError's kin
    """An entry of a shared source that does not load: the same problem on every node
    that chooses it, not this node's own."""


class EntrySource(Protocol):
    @property
    def where(self) -> str: ...

    @property
    def trouble(self) -> str | None: ...

    async def report(self, reason: str, message: str) -> bool:
        """Report a problem of the entries themselves (EntryRejected) once for the
        cluster, on the source's own object; False when this source cannot (a file or a
        directory: the node's Event says it), or could not now."""
        ...

    def changes(self) -> AbstractAsyncContextManager[AsyncIterator[str]]: ...

    def read(self, use: Callable[[Entries], T]) -> T:
        """Run `use` on the entries now; may block (files), so call it off the loop."""
        ...


class FileEntries:
    """The one config file (or one entry of a ConfigMap manifest, or none: flags, env vars
    and defaults), as one entry; it changes only when read again (reload, SIGHUP)."""

    trouble = None

    def __init__(
        self, where: str, load: Callable[[], LoadedConfig], *, first: LoadedConfig | None = None
    ) -> None:
        self.where = where  # the path, or how the defaults are reached
        self._load = load  # reads and checks the file; raises ConfigError
        self._first = first  # read already (at start): the first read uses it

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[str]]:
        yield _never()

    async def report(self, reason: str, message: str) -> bool:
        return False  # the node's own file

    def read(self, use: Callable[[Entries], T]) -> T:
        loaded, self._first = self._first, None
        load = self._load if loaded is None else lambda: loaded
        return use(Entries((self.where,), lambda _name: load(), self.where))


async def _never() -> AsyncIterator[str]:
    await asyncio.Event().wait()
    yield ""  # pragma: no cover


class ConfigMapWatch(Protocol):
    """The part of core.ports.NodeApi the ConfigMap source uses."""

    def watch_config_map(self, namespace: str, name: str) -> AsyncIterator[ConfigMapView]: ...

    async def report_config_problem(
        self, namespace: str, name: str, reason: str, message: str
    ) -> bool: ...


class DirectoryEntries:
    """The files of a directory, usually a mounted ConfigMap; `..` names never count."""

    trouble = None  # a directory is read where it is: never stale

    def __init__(self, path: str, watch: DirWatch) -> None:
        self.where = path
        self._watch = watch

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[str]]:
        async with self._watch(self.where, None) as events:
            yield _entry_events(events)

    async def report(self, reason: str, message: str) -> bool:
        return False  # the ConfigMap behind a mounted directory has no name here

    def read(self, use: Callable[[Entries], T]) -> T:
        """`use` again when the `..data` swap happened during the read."""
        for attempt in range(1, READ_ATTEMPTS + 1):
            before = _data_target(self.where)
            try:
                result = use(self._entries())
            except ConfigError:
                if attempt == READ_ATTEMPTS or _data_target(self.where) == before:
                    raise
                continue
            if attempt == READ_ATTEMPTS or _data_target(self.where) == before:
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _entries(self) -> Entries:
        files = config_dir_entries(self.where)
        return Entries(tuple(files), lambda name: load_config_file(files[name]), self.where)


class ConfigMapEntries:
    """The data entries of one ConfigMap, followed through the API. Its annotation
    DEFAULT_ANNOTATION names the default config. A ConfigMap that does not exist (deleted)
    is an error on read, so the config in force stays; binaryData is never a config."""

    def __init__(self, api: ConfigMapWatch, namespace: str, name: str) -> None:
        self.where = f"ConfigMap {namespace}/{name}"
        self._api = api
        self._namespace = namespace
        self._name = name
        self._view = ConfigMapView(None)

    @property
    def trouble(self) -> str | None:
        return self._view.trouble

    @contextlib.asynccontextmanager
    async def changes(self) -> AsyncIterator[AsyncIterator[str]]:
        """Entered once the ConfigMap was read (a failing first read raises)."""
        views = self._api.watch_config_map(self._namespace, self._name)
        try:
            first = await anext(views, None)
            if first is None:
                raise GpusliceError(f"the watch of {self.where} ended before a first read")
            self._view = first
            log.info("configmap_read", config_map=self.where, found=first.data is not None)
            yield self._follow(views)
        finally:
            aclose = getattr(views, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _follow(self, views: AsyncIterator[ConfigMapView]) -> AsyncIterator[str]:
        async for view in views:
            old, self._view = self._view, view
            if view.trouble != old.trouble:
                if view.trouble is None:
                    log.info("configmap_current_again", config_map=self.where)
                else:
                    log.warning(
                        "configmap_stale_keeping_config", config_map=self.where,
                        error=view.trouble,
                    )  # fmt: skip
            yield "configmap"  # a trouble change too: the manager's read then reports it

    async def report(self, reason: str, message: str) -> bool:
        return await self._api.report_config_problem(self._namespace, self._name, reason, message)

    def read(self, use: Callable[[Entries], T]) -> T:
        view = self._view  # one view throughout, whatever arrives meanwhile
        if view.data is None:
            raise ConfigError(f"{self.where} not found (deleted, or not created yet)")
        default = view.annotations.get(DEFAULT_ANNOTATION) or None
        load = partial(_load_entry, dict(view.data), self.where)
        return use(Entries(tuple(sorted(view.data)), load, self.where, default))


def _load_entry(data: Mapping[str, str], where: str, name: str) -> LoadedConfig:
    try:
        return load_config(data[name], source=f"{where}[{name}]")
    except ConfigError as exc:
        raise EntryRejected(str(exc)) from None


async def _entry_events(events: AsyncIterator[tuple[str, str]]) -> AsyncIterator[str]:
    async for name, _kind in events:
        if name == DATA_LINK or not name.startswith(".."):
            yield "directory"


def _data_target(directory: str) -> str | None:
    try:
        return os.readlink(os.path.join(directory, DATA_LINK))
    except OSError:
        return None  # a plain directory, not a mounted ConfigMap
