"""The labeller: computes the node's GFD labels and publishes them to every sink.

Run loop, as GFD: label and publish; oneshot stops there; otherwise relabel every
`interval_s` seconds, or (interval None, upstream's `infinite`) only when nudged, until
`stop` is set. nudge() (a config change) relabels at once, in the background: publishing
never holds up or fails what asked for it. Differences from GFD:
- the timestamp is renewed only when another label changes, so an unchanged node is not
  rewritten every interval (sinks compare what they hold and skip identical labels);
- every wait (the interval, a retry) is jittered by up to 20 % either way, so the nodes
  of a fleet, whose timers a cluster-wide switch restarts at one instant, drift apart;
- a failed labelling or sink write is retried on its own, `retry_s` after the first failure
  and twice as long after each next one, up to `retry_max_s` (or the interval), also in
  infinite mode (GFD exits); status() says how it stands; only oneshot raises it. While
  failing, a nudge that would publish the same labels waits for the retry (an absent
  sink, NFD's CRD, is not asked again at each nudge), and each failure is logged once
  per change of reason, for the labelling and for each sink.
On exit in interval mode every sink's remove() runs: the features file is deleted so its
labels vanish, as GFD does; the NodeFeature object is left to garbage collection.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.labels import TIMESTAMP_LABEL, label_node, with_timestamp
from gpuslice.core.ports import LabelSink
from gpuslice.core.restart import Backoff, jittered
from gpuslice.core.sharing import ResourceSettings
from gpuslice.core.waiting import first_of

log = structlog.get_logger("gpuslice.labeller")

RETRY_S = 1.0  # the first retry after a failure; each next one waits twice as long
RETRY_MAX_S = 300.0  # ... up to this (or the interval, when shorter)

# Labels without the timestamp; the labeller stamps them.
LabelSource = Callable[[], Awaitable[Mapping[str, str]]]
# The hardware and settings to label, read fresh for each labelling.
ReadNode = Callable[[], Awaitable[tuple[HardwareSnapshot, ResourceSettings]]]


def snapshot_labels(
    read: ReadNode,
    *,
    machine: str | None = None,
    more: Callable[[], Mapping[str, str]] | None = None,  # e.g. Isolation.labels
) -> LabelSource:
    """A LabelSource over core.labels (and `more`'s); its warnings are logged when they
    change."""
    seen: tuple[str, ...] = ()

    async def compute() -> Mapping[str, str]:
        nonlocal seen
        snapshot, settings = await read()
        result = label_node(snapshot, settings, machine=machine, more=more and more())
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


@dataclass(frozen=True)
class LabelPolicy:
    """When labels are published: every `interval_s` (None: only on changes), or once."""

    interval_s: float | None = 60.0
    oneshot: bool = False
    timestamps: bool = True
    retry_s: float = RETRY_S  # after a failure, doubling up to retry_max_s
    retry_max_s: float = RETRY_MAX_S

    def __post_init__(self) -> None:
        for name in ("interval_s", "retry_s", "retry_max_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")


class Labeller:
    def __init__(
        self,
        compute: LabelSource,
        sinks: Sequence[LabelSink],
        policy: LabelPolicy | None = None,  # None: the defaults
        *,
        clock: Callable[[], float] = time.time,
        rand: random.Random | None = None,
    ) -> None:
        policy = policy or LabelPolicy()
        self._compute = compute
        self._rand = rand or random.Random()  # noqa: S311 - jitter, not secrecy
        self._sinks = tuple(sinks)
        self._clock = clock
        self._interval = interval_s = policy.interval_s
        self._oneshot = policy.oneshot
        self._timestamps = policy.timestamps
        retry_max_s = policy.retry_max_s
        retry_max = retry_max_s if interval_s is None else min(retry_max_s, interval_s)
        self._retry = Backoff(first_s=min(policy.retry_s, retry_max), max_s=retry_max)
        self._lock = asyncio.Lock()
        self._nudged = asyncio.Event()
        self._attempted = asyncio.Condition()  # notified after each labelling
        self._labels: dict[str, str] | None = None
        self._published: int | None = None  # labels in place after the last success
        self._error: str | None = None  # why the last attempt failed
        self._retry_in: float | None = None
        self._sink_errors: dict[int, str] = {}  # sink position -> its error last logged

    @property
    def labels(self) -> Mapping[str, str] | None:
        """What was last computed (stamped), None before the first labelling."""
        return self._labels

    def nudge(self) -> None:
        """Relabel now in the background (the running loop does it); never waits or raises."""
        self._nudged.set()

    def status(self) -> dict[str, Any]:
        """{"ok": whether the last labelling reached every sink, "detail": what happened}."""
        if self._error is not None:
            retry = f"; next attempt in {self._retry_in:g}s" if self._retry_in else ""
            return {"ok": False, "detail": self._error + retry}
        if self._published is None:
            return {"ok": False, "detail": "not labelled yet"}
        return {"ok": True, "detail": f"{self._published} labels published"}

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Until done() holds: checked now and after each labelling, failed or not."""
        async with self._attempted:
            await self._attempted.wait_for(done)

    async def relabel(self) -> bool:
        """Compute and publish now; True when some sink wrote. Raises GpusliceError when
        the labels cannot be computed or a sink fails (after every sink was tried)."""
        async with self._lock:
            self._retry_in = None
            try:
                written = await self._publish()
            except Exception as exc:
                self._error = " ".join(str(exc).split()) or type(exc).__name__
                raise
            else:
                self._error = None
            finally:
                await self._notify()
            return written

    async def _notify(self) -> None:
        async with self._attempted:
            self._attempted.notify_all()

    async def _publish(self) -> bool:
        labels = dict(await self._compute())
        labels.pop(TIMESTAMP_LABEL, None)
        if self._timestamps:
            labels = with_timestamp(labels, int(self._clock()), self._labels)
        self._labels = labels
        written, errors = 0, []
        for i, sink in enumerate(self._sinks):
            try:
                written += await sink.publish(labels)
                self._sink_errors.pop(i, None)
            except GpusliceError as exc:
                said = log.debug if self._sink_errors.get(i) == str(exc) else log.warning
                said("label_sink_failed", sink=type(sink).__name__, error=str(exc))
                self._sink_errors[i] = str(exc)
                errors.append(exc)
        if written:
            log.info("labels_published", labels=len(labels), sinks=written)
        if errors:
            raise errors[0]
        self._published = len(labels)
        return written > 0

    async def run(self, stop: asyncio.Event) -> None:
        """Label until `stop` is set (once, raising any failure, when oneshot)."""
        if self._oneshot:
            await self.relabel()
            return
        failures = 0  # in a row; 0 after a success
        reported: str | None = None  # the failure last logged as an error
        try:
            while not stop.is_set():
                self._nudged.clear()  # a nudge from now on means another pass
                wait = self._interval
                try:
                    await self.relabel()
                    if failures:
                        log.info("labels_recovered")
                    failures, reported = 0, None
                except Exception:  # labels never stop the agent, whatever fails
                    failures += 1
                    wait = self._retry_in = self._retry.delay(failures)
                    # Each new reason is an error; the same one again only a debug line.
                    failed = log.debug if self._error == reported else log.error
                    reported = self._error
                    failed("labels_failed", error=reported, retry_s=wait)
                    await self._notify()
                if failures and wait is not None:
                    await self._back_off(stop, self.jittered(wait))
                else:
                    await self._sleep(stop, None if wait is None else self.jittered(wait))
        finally:
            if self._interval is not None:
                for sink in self._sinks:
                    await self._remove(sink)

    def jittered(self, seconds: float) -> float:
        """`seconds` give or take up to 20 %, drawn anew for each wait."""
        return jittered(seconds, self._rand.uniform)

    async def _back_off(self, stop: asyncio.Event, seconds: float) -> None:
        """After a failure: until `stop`, `seconds`, or a nudge that changes the labels
        (a nudge that would publish the same labels again waits for the retry)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not stop.is_set() and (left := deadline - loop.time()) > 0:
            await self._sleep(stop, left)
            if self._nudged.is_set():
                self._nudged.clear()
                if await self._labels_changed():
                    return

    async def _labels_changed(self) -> bool:
        try:
            labels = dict(await self._compute())
        except Exception:  # computing fails now: a retry says so
            return True
        last = dict(self._labels or {})
        last.pop(TIMESTAMP_LABEL, None)
        labels.pop(TIMESTAMP_LABEL, None)
        return labels != last

    async def _sleep(self, stop: asyncio.Event, seconds: float | None) -> None:
        """Until `stop`, a nudge or `seconds` (None: no limit)."""
        await first_of(stop.wait(), self._nudged.wait(), timeout_s=seconds)

    async def _remove(self, sink: LabelSink) -> None:
        try:
            await sink.remove()
        except GpusliceError as exc:
            log.warning("label_sink_remove_failed", sink=type(sink).__name__, error=str(exc))
