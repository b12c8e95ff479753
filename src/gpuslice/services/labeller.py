"""The labeller: computes the node's GFD labels and publishes them to every sink.

Run loop, as GFD: label and publish; oneshot stops there; otherwise relabel every
`interval_s` seconds, or (interval None, upstream's `infinite`) only when relabel() is
called, until `stop` is set. Differences from GFD:
- the timestamp is renewed only when another label changes, so an unchanged node is not
  rewritten every interval (sinks compare what they hold and skip identical labels);
- a failed labelling or sink write is logged and retried after `retry_s` (GFD exits),
  also in infinite mode; only oneshot raises it.
On exit in interval mode every sink's remove() runs: the features file is deleted so its
labels vanish, as GFD does; the NodeFeature object is left to garbage collection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.labels import TIMESTAMP_LABEL, label_node, with_timestamp
from gpuslice.core.ports import LabelSink
from gpuslice.core.sharing import ResourceSettings

log = structlog.get_logger("gpuslice.labeller")

RETRY_S = 10.0  # after a failure, the next attempt comes this soon (or at the interval)

# Labels without the timestamp; the labeller stamps them.
LabelSource = Callable[[], Awaitable[Mapping[str, str]]]
# The hardware and settings to label, read fresh for each labelling.
NodeState = Callable[[], Awaitable[tuple[HardwareSnapshot, ResourceSettings]]]


def snapshot_labels(read: NodeState, *, machine: str | None = None) -> LabelSource:
    """A LabelSource over core.labels; its warnings are logged when they change."""
    seen: tuple[str, ...] = ()

    async def compute() -> Mapping[str, str]:
        nonlocal seen
        snapshot, settings = await read()
        result = label_node(snapshot, settings, machine=machine)
        if result.warnings != seen:
            for warning in result.warnings:
                log.warning("label_warning", detail=warning)
            seen = result.warnings
        return result.labels

    return compute


class NodeFeaturePublisher(Protocol):
    """The part of core.ports.NodeApi that NodeFeatureSink uses."""

    async def publish_node_feature(
        self, node: str, namespace: str, labels: Mapping[str, str]
    ) -> bool: ...


class NodeFeatureSink:
    """A LabelSink over NodeApi: NodeFeature nvidia-features-for-<node> in `namespace`."""

    def __init__(self, api: NodeFeaturePublisher, node: str, namespace: str) -> None:
        self._api, self._node, self._namespace = api, node, namespace

    async def publish(self, labels: Mapping[str, str]) -> bool:
        return await self._api.publish_node_feature(self._node, self._namespace, labels)

    async def remove(self) -> None:
        """Nothing: the object's owner references let Kubernetes collect it, as upstream."""


class Labeller:
    def __init__(
        self,
        compute: LabelSource,
        sinks: Sequence[LabelSink],
        *,
        clock: Callable[[], float] = time.time,
        interval_s: float | None = 60.0,
        oneshot: bool = False,
        timestamps: bool = True,
        retry_s: float = RETRY_S,
    ) -> None:
        for name, value in (("interval_s", interval_s), ("retry_s", retry_s)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self._compute = compute
        self._sinks = tuple(sinks)
        self._clock = clock
        self._interval = interval_s
        self._oneshot = oneshot
        self._timestamps = timestamps
        self._retry = retry_s if interval_s is None else min(retry_s, interval_s)
        self._lock = asyncio.Lock()
        self._labels: dict[str, str] | None = None
        self._failed = False

    @property
    def labels(self) -> Mapping[str, str] | None:
        """What was last computed (stamped), None before the first labelling."""
        return self._labels

    async def relabel(self) -> bool:
        """Compute and publish now; True when some sink wrote. Raises GpusliceError when
        the labels cannot be computed or a sink fails (after every sink was tried)."""
        async with self._lock:
            self._failed = True
            labels = dict(await self._compute())
            labels.pop(TIMESTAMP_LABEL, None)
            if self._timestamps:
                labels = with_timestamp(labels, int(self._clock()), self._labels)
            self._labels = labels
            written, errors = 0, []
            for sink in self._sinks:
                try:
                    written += await sink.publish(labels)
                except GpusliceError as exc:
                    log.warning("label_sink_failed", sink=type(sink).__name__, error=str(exc))
                    errors.append(exc)
            if written:
                log.info("labels_published", labels=len(labels), sinks=written)
            if errors:
                raise errors[0]
            self._failed = False
            return written > 0

    async def run(self, stop: asyncio.Event) -> None:
        """Label until `stop` is set (once, raising any failure, when oneshot)."""
        if self._oneshot:
            await self.relabel()
            return
        try:
            while not stop.is_set():
                try:
                    await self.relabel()
                except GpusliceError as exc:
                    log.error("labels_failed", error=str(exc), retry_s=self._retry)
                wait = self._retry if self._failed else self._interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        finally:
            if self._interval is not None:
                for sink in self._sinks:
                    await self._remove(sink)

    async def _remove(self, sink: LabelSink) -> None:
        try:
            await sink.remove()
        except GpusliceError as exc:
            log.warning("label_sink_remove_failed", sink=type(sink).__name__, error=str(exc))
