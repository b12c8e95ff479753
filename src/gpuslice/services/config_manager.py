"""Which named config is in force on this node, followed live: one follower over a config
source, with the selector as its strategy.

The source (services.config_source: a mounted ConfigMap directory, the ConfigMap watched
through the API, or the one config file) says what the entries are; the selector
(services.config_selector) picks one: the entry the node label names, or the config file.
The manager reads the source and the selector's first read (the Node) first and acts only
after them, then applies the chosen config again whenever the selector or the source
changes or reload() is called (SIGHUP). Bursts of events are folded into one read, and
apply() runs only when the config actually changed (the config file: on every reload).
apply() returns once the config is served (the agent may still be starting), so `status`
and the logs say what is in force, never what was merely chosen.

A config that fails to load, validate or apply leaves the last good one in force; that is
logged, recorded as a Warning Event and shown by `status` (services.config_status). So does
an empty document replacing one that had content (a truncated write; `version: v1` alone is
the deliberate empty config). The Event is on the Node for the node's own problems; an
entry of the ConfigMap read through the API that does not load is the same problem on every
node, so it is reported once for the cluster, on the ConfigMap. Without a last good config
(at start) the error is raised to the caller. A source that cannot be followed (the API
unreachable, the watch refused) changes nothing served: `status` says so until it recovers.
At start, first reads the API does not answer (slow, away, erring, refusing) are tried
again until they work (services.api_wait): nothing is chosen meanwhile, and `status` says
what is waited for and the last error; the agent never exits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import structlog

from gpuslice.config.flags import explain
from gpuslice.config.loader import LoadedConfig
from gpuslice.config.settings import check_not_truncated
from gpuslice.config.v1 import Config
from gpuslice.core.errors import BackendError, GpusliceError
from gpuslice.core.metrics import NO_METRICS
from gpuslice.core.ports import Metrics
from gpuslice.core.selection import DEFAULT_FALLBACKS, DEFAULT_LABEL, Choice
from gpuslice.core.waiting import first_of, unless_stopped
from gpuslice.services.api_wait import ApiWait, until_read
from gpuslice.services.config_selector import (
    FileSelector,
    LabelSelector,
    NoCluster,
    NodeLabelSource,
    Selector,
)
from gpuslice.services.config_source import EntryRejected, EntrySource
from gpuslice.services.config_status import ConfigStatus, Standing
from gpuslice.services.off_loop import read_config

__all__ = ["ConfigManager", "ConfigStatus", "NoCluster", "NodeLabelSource"]

log = structlog.get_logger("gpuslice.config")

S = TypeVar("S")
T = TypeVar("T")
REJECTED_REASON = "ConfigRejected"
DEBOUNCE_S = 0.1


@dataclass(frozen=True)
class ConfigInputs(Generic[S]):
    """Where the configs come from, and how a loaded one becomes settings (flags and env
    applied)."""

    source: NodeLabelSource  # the node's labels, and where its Events go
    node: str
    entries: EntrySource
    to_settings: Callable[[LoadedConfig], S]


@dataclass(frozen=True)
class ConfigChoice:
    """How the config in force is chosen."""

    label: str | None = DEFAULT_LABEL  # None: one config, no label (the config file)
    default: str | None = None  # the flag: wins over a default the entries' source names
    fallbacks: Sequence[str] = DEFAULT_FALLBACKS
    debounce_s: float = DEBOUNCE_S


class ConfigManager(Generic[S]):
    """Owns the config in force. `to_settings` turns a loaded config into what `apply`
    takes (flags and env applied); `apply` may raise GpusliceError to refuse it. With
    `label` None the source has one config (the config file), else `label` names the
    entry, and `default` (the flag) wins over a default the entries' source names."""

    def __init__(
        self,
        inputs: ConfigInputs[S],
        apply: Callable[[S], Awaitable[None]],
        choice: ConfigChoice | None = None,  # None: by the default node label
        *,
        metrics: Metrics = NO_METRICS,
        api_wait: ApiWait | None = None,  # how first reads the API failed are tried again
    ) -> None:
        choice = choice or ConfigChoice()
        source, node = inputs.source, inputs.node
        self._api_wait = api_wait or ApiWait()
        self._selector: Selector = (
            FileSelector()
            if choice.label is None
            else LabelSelector(
                source, node, choice.label, default=choice.default, fallbacks=choice.fallbacks
            )
        )
        self._events = source
        self._node = node
        self._entries = inputs.entries
        self._to_settings = inputs.to_settings
        self._apply = apply
        self._metrics = metrics
        self._debounce_s = choice.debounce_s
        self.ready = asyncio.Event()  # set once the first config was applied
        self._standing = Standing(self._selector.first_detail)
        self._applied: tuple[str | None, Config] | None = None
        self._choice: Choice | None = None
        self._loaded: LoadedConfig | None = None
        self._settings: S | None = None
        self._wake = asyncio.Event()
        self._causes: set[str] = set()
        self._lock = asyncio.Lock()
        self._pool: ThreadPoolExecutor | None = None  # reads the entries while running

    @property
    def status(self) -> ConfigStatus:
        status, trouble = self._standing.status, self._entries.trouble
        if trouble is None:
            return status
        where = self._entries.where
        message = f"cannot follow {where}, retrying; keeping what it last said: {trouble}"
        return replace(status, ok=False, source=message)

    @property
    def rejected(self) -> str | None:
        """Why the last read was refused, until one is not."""
        return self._standing.rejected

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
        return self._selector.value

    @property
    def checks(self) -> int:
        """How many reads of the label and directory have finished."""
        return self._standing.checks

    async def wait_checked(self, seen: int) -> int:
        """Return once `checks` != seen (at once if it already is)."""
        return await self._standing.wait_checked(seen)

    @property
    def one_config(self) -> bool:
        """True for the config file: no label, nothing chosen."""
        return self._selector.one_config

    async def run(
        self, stop: asyncio.Event | None = None, reload: asyncio.Event | None = None
    ) -> None:
        """Apply the first config after the first reads (raising when it is bad), then
        follow changes until `stop` is set; each set of `reload` re-reads. Changes seen
        while the first config is still being applied are read right after it."""
        stop = stop or asyncio.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuslice-config")
        try:
            async with contextlib.AsyncExitStack() as opened:
                # The first reads may hang on a silent API server: a stop ends them.
                first = await unless_stopped(self._open(opened), stop)
                if first is None:
                    return
                entry_changes = first.result()  # raises what the first reads did
                loops = [
                    self._start(),
                    self._follow_entries(entry_changes),
                    self._settle(),
                    self._selector.follow(self._poke),
                ]
                if reload is not None:
                    loops.append(self._reload_on(reload))
                await first_of(stop.wait(), *(_then_idle(loop) for loop in loops))
        finally:
            pool, self._pool = self._pool, None
            pool.shutdown(wait=True)  # a read in flight ends first (it is bounded)
            await self._selector.aclose()

    async def _open(self, opened: contextlib.AsyncExitStack) -> AsyncIterator[str]:
        """The entries' changes (after the source's first read), once the selector's
        first read is done too; each first read waits out the API (services.api_wait)."""
        entry_changes = await self._until_read(
            lambda: opened.enter_async_context(self._entries.changes()), self._entries.where
        )
        await self._until_read(self._selector.open, f"Node {self._node}")
        return entry_changes

    async def _until_read(self, read: Callable[[], Awaitable[T]], what: str) -> T:
        def waiting(detail: str) -> None:
            self._standing.waiting(None, detail)

        return await until_read(read, what, waiting, self._api_wait)

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
            self._selector.begin_read()
            try:
                await self._use(*await self._read_off_loop(), cause)
                return True
            except GpusliceError as exc:
                return await self._refused(exc, cause)
            finally:
                await self._standing.checked()

    async def _refused(self, exc: GpusliceError, cause: str) -> bool:
        one_config = self._selector.one_config
        if isinstance(exc, BackendError) and one_config and self._choice:
            # The hardware could not be read: not the config file's fault.
            log.error("hardware_unreadable_keeping_last_good", error=str(exc))
            return False
        self._metrics.config_rejected(self._selector.rejected_name(self._loaded))
        if self._choice is None:  # nothing in force yet: the caller must see it
            self._standing.waiting(None, f"no config in force: {explain(exc)}")
            if not one_config:  # the config file's error ends the command
                log.error("config_rejected_at_start", error=explain(exc))
                await self._record(self._standing.status.detail, exc)
            raise exc
        serving = self._choice.shown
        message = self._selector.refusal(serving, exc, cause)
        self._standing.refused(serving, message)
        await self._record(message, exc)
        return False

    async def _read_off_loop(self) -> tuple[Choice, LoadedConfig]:
        """Read on the manager's worker thread (files may block; a fresh thread outside
        run()), bounded in time (services.off_loop)."""
        return await read_config(self._read, executor=self._pool)

    def _read(self) -> tuple[Choice, LoadedConfig]:
        return self._entries.read(self._selector.choose)

    async def _use(self, choice: Choice, loaded: LoadedConfig, cause: str) -> None:
        if self._loaded is not None:
            check_not_truncated(loaded, self._loaded)
        key = (choice.name, loaded.config)
        if key == self._applied and not self._selector.reapplies:
            if not self._standing.status.ok:
                log.info("config_accepted_again", config=choice.shown, cause=cause)
            else:
                log.debug("config_unchanged", config=choice.shown, cause=cause)
        else:
            settings = self._to_settings(loaded)
            previous = self._choice.shown if self._choice else None
            pending = f"applying {choice.shown} ({choice.reason}): waiting until it is served"
            self._standing.waiting(previous, pending)
            await self._apply(settings)
            self._applied, self._settings, self._loaded = key, settings, loaded
            if not self._selector.one_config:  # the agent logs what it applied
                log.info(
                    "config_chosen",
                    config=choice.shown,
                    previous=previous,
                    reason=choice.reason,
                    cause=cause,
                    source=loaded.source,
                )
        self._choice = choice
        self._standing.accepted(choice.shown, choice.reason)

    async def _record(self, message: str, exc: GpusliceError) -> None:
        """An Event for a rejection, once per message: on the shared source itself, once
        for the cluster, when the entry is at fault (every node choosing it finds the same);
        else (or when that fails) on the Node."""
        if not self._standing.first_report(message):
            return
        if isinstance(exc, EntryRejected) and await self._entries.report(REJECTED_REASON, str(exc)):
            return
        await self._events.record_event(self._node, REJECTED_REASON, message, warning=True)

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

    async def _follow_entries(self, changes: AsyncIterator[str]) -> None:
        async for cause in changes:
            self._poke(cause)

    async def _reload_on(self, reload: asyncio.Event) -> None:
        await self.ready.wait()  # one asked for while the first config is applied: after it
        while True:
            await reload.wait()
            reload.clear()
            await self.reload()


async def _then_idle(loop: Coroutine[Any, Any, None]) -> None:
    """`loop`, then nothing until cancelled: a loop that ends is fine (a failure is not)."""
    await loop
    await asyncio.Event().wait()
