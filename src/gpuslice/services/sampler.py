"""Accounting: sample processes every interval and join them with the kubelet's allocations.

Each sample is one blocking call on the agent's backend worker (the backend's
per-process read, the owners of those pids, the kubelet's device checkpoint), then
two PodResources calls and the pure join. The latest attribution and the time of
the last successful sample are kept; peaks are carried only for containers still
listed, so memory stays bounded by what the node runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog

from gpuslice.core.attribution import (
    Attribution,
    attribute,
    with_cgroup_usage,
    with_pod_uids,
)
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.ports import GpuBackend, PodResources, ProcessOwners
from gpuslice.core.usage import CheckpointEntry, ProcessOwner, ProcessSample

log = structlog.get_logger("gpuslice.sampler")

DEFAULT_INTERVAL = "10s"
# fn(backend) on the backend worker: Agent.on_backend.
OnBackend = Callable[[Callable[[GpuBackend], "Reading"]], Awaitable["Reading"]]
CgroupUsed = Callable[[GpuBackend], Mapping[tuple[str, str], int]]


@dataclass(frozen=True, slots=True)
class Reading:
    """What one worker call reads."""

    sample: ProcessSample
    owners: dict[int, ProcessOwner]
    uids: tuple[CheckpointEntry, ...]
    cgroup_used: Mapping[tuple[str, str], int]  # (pod UID, GPU UUID) -> the limit's currentUsed


@dataclass(frozen=True)
class SampleSources:
    """Where each sample is read from."""

    on_backend: OnBackend
    hardware: Callable[[], HardwareSnapshot]
    pod_resources: PodResources
    owners: ProcessOwners | None = None  # None: the backend's own (the simulated one's)
    cgroup_used: CgroupUsed | None = None  # e.g. Isolation.usage: exact per-pod memory


@dataclass(frozen=True)
class SampleHooks:
    """Who is told of each sample."""

    sampled: Callable[[float, float], None] | None = None  # e.g. Metrics.sampled
    failed: Callable[[], None] | None = None  # e.g. Metrics.sample_failed
    after: Callable[[Attribution], Awaitable[None]] | None = None  # e.g. Watchdog.check


class Sampler:
    def __init__(
        self,
        sources: SampleSources,
        hooks: SampleHooks | None = None,
        *,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        hooks = hooks or SampleHooks()
        self._cgroup_used = sources.cgroup_used
        self._on_backend = sources.on_backend
        self._hardware = sources.hardware
        self._pods = sources.pod_resources
        self._owners = sources.owners
        self.interval_s = interval_s
        self._clock = clock
        self._sampled, self._failed, self._after = hooks.sampled, hooks.failed, hooks.after
        self.latest: Attribution | None = None
        self.last_success: float | None = None  # wall-clock time of the latest good sample
        self.error: str | None = None  # why the latest sample failed; None after a good one
        self.samples = 0

    def _read(self, backend: GpuBackend) -> Reading:
        sample = backend.processes()
        owners = owners_of(self._owners, backend)
        owned = dict(owners.owners(sample.pids())) if owners is not None else {}
        used = self._cgroup_used(backend) if self._cgroup_used is not None else {}
        return Reading(sample, owned, self._pods.pod_uids(), used)

    async def sample_once(self) -> Attribution | None:
        """Take one sample; on failure keep the last attribution and say why."""
        try:
            reading = await self._on_backend(self._read)
            listed = await self._pods.list()
            allocatable = await self._pods.allocatable()
        except GpusliceError as exc:
            if self.error != str(exc):
                log.warning("sample_failed", error=str(exc))
            self.error = str(exc)
            if self._failed is not None:
                self._failed()
            return None
        allocations = with_pod_uids(listed, reading.uids)
        peaks = self.latest.peaks() if self.latest is not None else None
        self.latest = with_cgroup_usage(
            attribute(
                self._hardware(), reading.sample, allocations, allocatable, reading.owners, peaks
            ),
            reading.cgroup_used,
        )
        if self.error is not None:
            log.info("sample_recovered")
        self.error = None
        self.last_success = self._clock()
        self.samples += 1
        if self._sampled is not None:
            self._sampled(self.last_success, self.interval_s)
        return self.latest

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every interval until `stop` is set."""
        while not stop.is_set():
            result = await self.sample_once()
            if result is not None and self._after is not None:
                await self._after(result)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)


def owners_of(host: ProcessOwners | None, backend: GpuBackend) -> ProcessOwners | None:
    """Who owns a GPU process: the host's reader, else the backend's own (simulated)."""
    return host if host is not None else backend.process_owners()
