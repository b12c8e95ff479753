"""Which named config is in force on this node, followed live.

The node label (nvidia.com/device-plugin.config by default) names an entry of a source of
named configs (config_source: a mounted ConfigMap directory, or the ConfigMap watched
through the API); core.selection holds the rules (default config, fallbacks). The manager
reads the Node first and acts only after that read, then applies the chosen config again
whenever the label changes, the source changes or reload() is called (SIGHUP). Bursts of
events are folded into one read, and apply() runs only when the config actually changed.
apply() returns once the config is served (the agent may still be starting), so `status`
and the logs say what is in force, never what was merely chosen.

With no label (`label=None`) the source has one config (services.config_source.FileEntries:
the config file), read at start and again on each reload (SIGHUP); nothing is chosen.

A config that fails to load, validate or apply leaves the last good one in force; that is
logged, recorded as a Warning Event and shown by `status`. So does an empty document
replacing one that had content (a truncated write; `version: v1` alone is the deliberate
empty config). The Event is on the Node for the node's own problems; an entry of the
ConfigMap read through the API that does not load is the same problem on every node, so it
is reported once for the cluster, on the ConfigMap. Without a last good config (at start)
the error is raised to the caller. A source that cannot be followed (the API unreachable,
the watch refused) changes nothing served: `status` says so until it recovers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

import structlog

from gpuslice.config.loader import LoadedConfig
from gpuslice.config.settings import check_not_truncated
from gpuslice.config.v1 import Config
from gpuslice.core.errors import BackendError, ConfigError, GpusliceError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import Metrics
from gpuslice.core.selection import (
    DEFAULT_FALLBACKS,
    DEFAULT_LABEL,
    Choice,
    check_fallbacks,
    choose_config,
)
from gpuslice.core.waiting import first_of, unless_stopped
from gpuslice.services.config_source import Entries, EntryRejected, EntrySource
from gpuslice.services.off_loop import read_config

log = structlog.get_logger("gpuslice.config")

S = TypeVar("S")
REJECTED_REASON = "ConfigRejected"
DEBOUNCE_S = 0.1


class NodeLabelSource(Protocol):
    """The part of core.ports.NodeApi the manager uses."""

    def watch_node_labels(self, node: str) -> AsyncIterator[dict[str, str]]: ...

    async def record_event(
        self, node: str, reason: str, message: str, *, warning: bool
    ) -> None: ...


class NoCluster:
    """The label source without a Kubernetes API: the Node reads as unlabelled, and
    Events go nowhere (the log and readiness still say what was refused)."""

    async def watch_node_labels(self, node: str) -> AsyncIterator[dict[str, str]]:
        yield {}
        await asyncio.Event().wait()

    async def record_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        return None


@dataclass(frozen=True, slots=True)
class ConfigStatus:
    """The readiness detail: the config in force and whether the wanted one was accepted."""

    config: str | None  # the entry in force, "(empty)" for the empty config; None before start
    ok: bool  # False before start, while a newer config is rejected, and while `source` is set
    detail: str
    source: str | None = None  # why the source cannot be followed now (the last read serves)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"config": self.config, "ok": self.ok, "detail": self.detail}
        if self.source is not None:
            out["source"] = self.source
        return out


class ConfigManager(Generic[S]):
    """Owns the config in force. `to_settings` turns a loaded config into what `apply`
    takes (flags and env applied); `apply` may raise GpusliceError to refuse it. `default`
    (the flag) wins over a default the entries' source names."""

    def __init__(
        self,
        source: NodeLabelSource,
        node: str,
        entries: EntrySource,
        to_settings: Callable[[LoadedConfig], S],
        apply: Callable[[S], Awaitable[None]],
        *,
        label: str | None = DEFAULT_LABEL,  # None: one config, no label (the config file)
        default: str | None = None,
        fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
        debounce_s: float = DEBOUNCE_S,
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._source = source
        self._metrics = metrics
        self._wanted: str | None = None  # the config the current read chose, once chosen
        self._node = node
        self._entries = entries
        self._to_settings = to_settings
        self._apply = apply
        self._label = label
        self._default = default or None
        self._ignored: str | None = None  # a default of the source's, overridden by `default`
        self._fallbacks = check_fallbacks(fallbacks)
        self._debounce_s = debounce_s
        self.ready = asyncio.Event()  # set once the first config was applied
        self._label_value: str | None = None
        self._applied: tuple[str | None, Config] | None = None
        self._choice: Choice | None = None
        self._loaded: LoadedConfig | None = None
        self._settings: S | None = None
        first = f"waiting for the first read of Node {node}" if label else "reading the config"
        self._status = ConfigStatus(None, False, first)
        self._reported = ""  # the last rejection recorded as an Event
        self.rejected: str | None = None  # why the last read was refused, until one is not
        self._wake = asyncio.Event()
        self._causes: set[str] = set()
        self._lock = asyncio.Lock()
        self._checks = 0
        self._checked = asyncio.Condition()
        self._pool: ThreadPoolExecutor | None = None  # reads the entries while running

    @property
    def status(self) -> ConfigStatus:
        trouble = self._entries.trouble
        if trouble is None:
            return self._status
        where = self._entries.where
        message = f"cannot follow {where}, retrying; keeping what it last said: {trouble}"
        return replace(self._status, ok=False, source=message)

    @property
    def settings(self) -> S | None:
        """What was last applied (None before start)."""
        return self._settings

    @property
    def current(self) -> LoadedConfig | None:
        """The config in force, as loaded (before flags and env are applied)."""
        return self._loaded

    @property
    def choice(self) -> Choice | None:
        return self._choice

    @property
    def label(self) -> str | None:
        """The node label's value as last read (None: unset, or before the first read)."""
        return self._label_value

    @property
    def checks(self) -> int:
        """How many reads of the label and directory have finished."""
        return self._checks

    async def wait_checked(self, seen: int) -> int:
        """Return once `checks` != seen (at once if it already is)."""
        async with self._checked:
            await self._checked.wait_for(lambda: self._checks != seen)
            return self._checks

    @property
    def one_config(self) -> bool:
        """True for the config file: no label, nothing chosen."""
        return self._label is None

    async def run(
        self, stop: asyncio.Event | None = None, reload: asyncio.Event | None = None
    ) -> None:
        """Apply the first config after the first read of the Node (raising when it is bad),
        then follow changes until `stop` is set; each set of `reload` re-reads. Changes
        seen while the first config is still being applied are read right after it."""
        stop = stop or asyncio.Event()
        labels = None if self._label is None else self._source.watch_node_labels(self._node)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-config")
        try:
            async with contextlib.AsyncExitStack() as opened:
                # The first reads may hang on a silent API server: a stop ends them.
                first = await unless_stopped(self._open(labels, opened), stop)
                if first is None:
                    return
                entry_changes = first.result()
                loops = [self._start(), self._follow_entries(entry_changes), self._settle()]
                if labels is not None:
                    loops.append(self._follow_labels(labels))
                if reload is not None:
                    loops.append(self._reload_on(reload))
                await _run_until(stop, loops)
        finally:
            pool, self._pool = self._pool, None
            pool.shutdown(wait=True)  # a read in flight ends first (it is bounded)
            aclose = getattr(labels, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _open(
        self, labels: AsyncIterator[dict[str, str]] | None, opened: contextlib.AsyncExitStack
    ) -> AsyncIterator[str]:
        """The entries' changes (after the source's first read) and the Node's first labels
        (none for the config file)."""
        entry_changes = await opened.enter_async_context(self._entries.changes())
        if labels is None:
            return entry_changes
        first = await anext(labels, None)
        if first is None:
            raise GpusliceError(f"the watch of Node {self._node} ended before a first read")
        self._label_value = first.get(self._label or "") or None
        log.info("node_labels_read", label=self._label, value=self._label_value)
        return entry_changes

    async def _start(self) -> None:
        await self._refresh("start")
        self.ready.set()

    async def reload(self) -> bool:
        """Read the label's config again now; False when it was rejected (or before start)."""
        if not self.ready.is_set():
            log.warning("config_reload_before_start", node=self._node)
            return False
        return await self._refresh("reload")

    async def _refresh(self, cause: str) -> bool:
        async with self._lock:
            self._wanted = None
            try:
                await self._use(*await self._read_off_loop(), cause)
                return True
            except GpusliceError as exc:
                if isinstance(exc, BackendError) and self.one_config and self._choice:
                    # The hardware could not be read: not the config file's fault.
                    log.error("hardware_unreadable_keeping_last_good", error=str(exc))
                    return False
                self._metrics.config_rejected(self._rejected_name())
                if self._choice is None:  # nothing in force yet: the caller must see it
                    self._status = ConfigStatus(None, False, f"no config in force: {exc}")
                    if not self.one_config:  # the config file's error ends the command
                        log.error("config_rejected_at_start", error=str(exc))
                        await self._record(self._status.detail, exc)
                    raise
                await self._reject(exc, cause)
                return False
            finally:
                async with self._checked:
                    self._checks += 1
                    self._checked.notify_all()

    async def _read_off_loop(self) -> tuple[Choice, LoadedConfig]:
        """Read on the manager's worker thread (files may block; a fresh thread outside
        run()), bounded in time (services.off_loop)."""
        return await read_config(self._read, executor=self._pool)

    def _rejected_name(self) -> str:
        if self.one_config:  # the file keeps its name: the one in force
            return getattr(self._settings, "shown", "")
        return self._wanted or self._label_value or self._default or ""

    def _read(self) -> tuple[Choice, LoadedConfig]:
        return self._entries.read(self._choose)

    def _choose(self, entries: Entries) -> tuple[Choice, LoadedConfig]:
        """Choose among the entries and load the chosen one. Raises ConfigError."""
        if self.one_config:
            (name,) = entries.names
            return Choice(name, "the config file"), entries.load(name)
        if self._default and entries.default not in (None, self._default, self._ignored):
            self._ignored = entries.default
            log.warning("default_config_of_source_ignored", ignored=entries.default,
                        default=self._default, source=entries.where)  # fmt: skip
        try:
            choice = choose_config(
                self._label_value,
                entries.names,
                default=self._default or entries.default,
                fallbacks=self._fallbacks,
                label=self._label or DEFAULT_LABEL,
            )
        except ConfigError as exc:  # say where the available names were looked up
            raise ConfigError(f"{exc} (configs in {entries.where})") from None
        self._wanted = choice.shown
        if choice.name is None:
            return choice, LoadedConfig(Config(), source=f"{entries.where} (empty config)")
        return choice, replace(entries.load(choice.name), name=choice.name)

    async def _use(self, choice: Choice, loaded: LoadedConfig, cause: str) -> None:
        if self._loaded is not None:
            check_not_truncated(loaded, self._loaded)
        key = (choice.name, loaded.config)
        if key == self._applied and not self.one_config:  # a SIGHUP re-reads the hardware too
            if not self._status.ok:
                log.info("config_accepted_again", config=choice.shown, cause=cause)
            else:
                log.debug("config_unchanged", config=choice.shown, cause=cause)
        else:
            settings = self._to_settings(loaded)
            previous = self._choice.shown if self._choice else None
            pending = f"applying {choice.shown} ({choice.reason}): waiting until it is served"
            self._status = ConfigStatus(previous, False, pending)
            await self._apply(settings)
            self._applied, self._settings, self._loaded = key, settings, loaded
            if not self.one_config:  # the agent logs what it applied
                log.info(
                    "config_chosen",
                    config=choice.shown,
                    previous=previous,
                    reason=choice.reason,
                    cause=cause,
                    source=loaded.source,
                )
        self._choice = choice
        self._status = ConfigStatus(choice.shown, True, choice.reason)
        self._reported = ""
        self.rejected = None

    async def _reject(self, exc: GpusliceError, cause: str) -> None:
        assert self._choice is not None
        serving = self._choice.shown
        if self.one_config:
            message = self.rejected = f"config rejected, keeping the last good one: {exc}"
            log.error("config_rejected_keeping_last_good", error=str(exc))
            self._status = ConfigStatus(serving, False, message)
            await self._record(message, exc)
            return
        message = self.rejected = f"config rejected, keeping {serving}: {exc}"
        log.warning(
            "config_rejected_keeping_last_good", serving=serving, error=str(exc), cause=cause
        )
        self._status = ConfigStatus(serving, False, message)
        await self._record(message, exc)

    async def _record(self, message: str, exc: GpusliceError) -> None:
        """An Event for a rejection, once per message: on the shared source itself, once
        for the cluster, when the entry is at fault (every node choosing it finds the same);
        else (or when that fails) on the Node."""
        if message == self._reported:
            return
        self._reported = message
        if isinstance(exc, EntryRejected) and await self._entries.report(REJECTED_REASON, str(exc)):
            return
        await self._source.record_event(self._node, REJECTED_REASON, message, warning=True)

    def _poke(self, cause: str) -> None:
        self._causes.add(cause)
        self._wake.set()

    async def _settle(self) -> None:
        """One read per burst: wait out the debounce window after the first event."""
        await self.ready.wait()  # what was seen during the first apply is read after it
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._debounce_s)
            self._wake.clear()
            causes, self._causes = self._causes, set()
            await self._refresh("+".join(sorted(causes)))

    async def _follow_labels(self, labels: AsyncIterator[dict[str, str]]) -> None:
        async for current in labels:
            value = current.get(self._label or "") or None
            if value != self._label_value:
                log.info(
                    "config_label_changed", label=self._label, old=self._label_value, new=value
                )
                self._label_value = value
                self._poke("label")
        log.warning("node_label_watch_ended", node=self._node)

    async def _follow_entries(self, changes: AsyncIterator[str]) -> None:
        async for cause in changes:
            self._poke(cause)

    async def _reload_on(self, reload: asyncio.Event) -> None:
        await self.ready.wait()  # one asked for while the first config is applied: after it
        while True:
            await reload.wait()
            reload.clear()
            await self.reload()


async def _run_until(stop: asyncio.Event, loops: list[Coroutine[Any, Any, None]]) -> None:
    """Run `loops` until `stop` is set; a loop's failure is raised, one that ends is fine."""
    await first_of(stop.wait(), *(_then_idle(loop) for loop in loops))


async def _then_idle(loop: Coroutine[Any, Any, None]) -> None:
    await loop
    await asyncio.Event().wait()
