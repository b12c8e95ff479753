"""How the config manager picks the config in force among its source's entries: the
strategy it follows a source with.

`LabelSelector`: the node label (nvidia.com/device-plugin.config by default) names an
entry; core.selection holds the rules (default config, fallbacks). The Node is read first,
then followed: each change of the label asks the manager for a read. An unchanged choice
is not applied again, and a refusal is the node's (or the shared entry's) Event.

`FileSelector`: one config (services.config_source.FileEntries: the config file), nothing
chosen and nothing followed; each reload (SIGHUP) applies it again, which re-reads the
hardware too, and a hardware that cannot be read then is not the file's fault.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Protocol

import structlog

from gpuslice.config.flags import explain
from gpuslice.config.loader import LoadedConfig
from gpuslice.config.v1 import Config
from gpuslice.core.errors import ConfigError, GpusliceError
from gpuslice.core.selection import DEFAULT_FALLBACKS, DEFAULT_LABEL, Choice, choose_config
from gpuslice.core.selection import check_fallbacks as _checked_fallbacks
from gpuslice.services.config_source import Entries

log = structlog.get_logger("gpuslice.config")


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


class Selector(Protocol):
    one_config: bool  # the config file: status is `rejected` alone, nothing is chosen
    reapplies: bool  # an unchanged config is applied again (a reload re-reads the hardware)
    first_detail: str  # the status before the first read

    @property
    def value(self) -> str | None:
        """The node label's value as last read (None: unset, before the first read, or
        no label)."""
        ...

    async def open(self) -> None:
        """The first read the first choice waits for (the Node's labels)."""
        ...

    def begin_read(self) -> None:
        """A read of the entries begins: nothing is wanted until it chooses."""
        ...

    async def follow(self, poke: Callable[[str], None]) -> None:
        """Call `poke` with a cause on each change that may change the choice."""
        ...

    async def aclose(self) -> None: ...

    def choose(self, entries: Entries) -> tuple[Choice, LoadedConfig]:
        """Choose among the entries and load the chosen one. Raises ConfigError."""
        ...

    def rejected_name(self, in_force: LoadedConfig | None) -> str:
        """The config a refusal is counted against (the metric's label)."""
        ...

    def refusal(self, serving: str, exc: GpusliceError, cause: str) -> str:
        """Log a refused read, keeping `serving`; the one-line message for status."""
        ...


class FileSelector:
    one_config = True
    reapplies = True
    first_detail = "reading the config"
    value = None

    async def open(self) -> None:
        return None

    def begin_read(self) -> None:
        return None

    async def follow(self, poke: Callable[[str], None]) -> None:
        return None  # read again only on reload

    async def aclose(self) -> None:
        return None

    def choose(self, entries: Entries) -> tuple[Choice, LoadedConfig]:
        (name,) = entries.names
        return Choice(name, "the config file"), entries.load(name)

    def rejected_name(self, in_force: LoadedConfig | None) -> str:
        if in_force is None:
            return ""
        return in_force.name or in_force.source or "(defaults)"  # the file keeps its name

    def refusal(self, serving: str, exc: GpusliceError, cause: str) -> str:
        log.error("config_rejected_keeping_last_good", error=explain(exc))
        return f"config rejected, keeping the last good one: {explain(exc)}"


class LabelSelector:
    """The entry the node label names. `default` (the flag) wins over a default the
    entries' source names."""

    one_config = False
    reapplies = False

    def __init__(
        self,
        source: NodeLabelSource,
        node: str,
        label: str = DEFAULT_LABEL,
        *,
        default: str | None = None,
        fallbacks: Sequence[str] = DEFAULT_FALLBACKS,
    ) -> None:
        self._source, self._node, self._label = source, node, label
        self._default = default or None
        self._fallbacks = _checked_fallbacks(fallbacks)
        self._ignored: str | None = None  # a default of the source's, overridden by `default`
        self._value: str | None = None
        self._wanted: str | None = None  # the config the current read chose, once chosen
        self._labels: AsyncIterator[dict[str, str]] | None = None
        self.first_detail = (
            f"waiting for the first read of Node {node}" if label else ("reading the config")
        )

    @property
    def value(self) -> str | None:
        return self._value

    async def open(self) -> None:
        self._labels = self._source.watch_node_labels(self._node)
        first = await anext(self._labels, None)
        if first is None:
            raise GpusliceError(f"the watch of Node {self._node} ended before a first read")
        self._value = first.get(self._label) or None
        log.info("node_labels_read", label=self._label, value=self._value)

    def begin_read(self) -> None:
        self._wanted = None

    async def follow(self, poke: Callable[[str], None]) -> None:
        assert self._labels is not None, "open() first"
        async for current in self._labels:
            value = current.get(self._label) or None
            if value != self._value:
                log.info("config_label_changed", label=self._label, old=self._value, new=value)
                self._value = value
                poke("label")
        log.warning("node_label_watch_ended", node=self._node)

    async def aclose(self) -> None:
        labels, self._labels = self._labels, None
        aclose = getattr(labels, "aclose", None)
        if aclose is not None:
            await aclose()

    def choose(self, entries: Entries) -> tuple[Choice, LoadedConfig]:
        if self._default and entries.default not in (None, self._default, self._ignored):
            self._ignored = entries.default
            log.warning("default_config_of_source_ignored", ignored=entries.default,
                        default=self._default, source=entries.where)  # fmt: skip
        try:
            choice = choose_config(
                self._value,
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

    def rejected_name(self, in_force: LoadedConfig | None) -> str:
        return self._wanted or self._value or self._default or ""

    def refusal(self, serving: str, exc: GpusliceError, cause: str) -> str:
        log.warning(
            "config_rejected_keeping_last_good", serving=serving, error=explain(exc), cause=cause
        )
        return f"config rejected, keeping {serving}: {explain(exc)}"
