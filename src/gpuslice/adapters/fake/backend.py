"""FakeBackend: a GpuBackend over a described node, with injected health events."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Collection

import structlog

from gpuslice.adapters.fake.events import EventFile, parse_event
from gpuslice.adapters.fake.mig import MigFault, MigState
from gpuslice.adapters.fake.processes import ProcessTable
from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.errors import BackendError
from gpuslice.core.isolation import UNLIMITED, Limit, LimitReading, driver_problem
from gpuslice.core.mig import GpuInstance, MigProfileSpec
from gpuslice.core.usage import ProcessOwner, ProcessSample

_log = structlog.get_logger()

FALLEN_OFF_THE_BUS_XID = 79


class FakeBackend:
    """Serves a fixed snapshot; health follows the optional events file.

    A GPU is lost (probe False) after {"lost": true} or XID 79 until a
    {"recovered": true} line. A lost GPU stays in the snapshot. Processes are the
    node file's, changed by "process" and "process_exit" lines; their pods come from
    those lines too (`owners`), as the simulated pids are not real. MIG layouts change
    through the MigControl calls (fake.mig), and the snapshot shows them. Malformed event
    lines are skipped, logged as warnings and kept in `warnings`.
    """

    def __init__(
        self,
        snapshot: HardwareSnapshot,
        events_path: str | os.PathLike[str] | None = None,
        *,
        poll_interval_s: float = 0.02,
    ) -> None:
        self._snapshot = snapshot
        self._events = EventFile(events_path) if events_path is not None else None
        self._poll_s = poll_interval_s
        self._pending: deque[HealthEvent] = deque()
        self._lost: set[str] = set()
        self._processes = ProcessTable(snapshot)
        self._warnings: list[str] = []
        self._refused: list[str] = []  # allocations refused past a hard limit, oldest first
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._mig = MigState(snapshot, self._processes.running_on)
        self._parent: dict[str, str] = {}
        self._relayout()

    @classmethod
    def from_spec(cls, spec: str, events_path: str | None = None) -> FakeBackend:
        """`spec` is a built-in profile name or a YAML node file path (ConfigError if bad)."""
        return cls(load_spec(spec), events_path)

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per skipped event line."""
        with self._lock:
            return tuple(self._warnings)

    def snapshot(self) -> HardwareSnapshot:
        with self._lock:
            return self._snapshot

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            with self._lock:
                self._ingest()
                if self._pending:
                    return self._pending.popleft()
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed.is_set():
                return None
            self._closed.wait(min(self._poll_s, remaining) if self._events else remaining)

    def probe(self, gpu_uuid: str) -> bool:
        """True unless the GPU (or a MIG device's parent) is lost or unknown."""
        with self._lock:
            self._ingest()
            parent = self._parent.get(gpu_uuid)
            return parent is not None and parent not in self._lost

    def processes(self) -> ProcessSample:
        with self._lock:
            self._ingest()
            return self._processes.sample()

    def process_owners(self) -> FakeBackend:
        return self

    def owners(self, pids: Collection[int]) -> dict[int, ProcessOwner]:
        """The pods the events file gave these processes (the ProcessOwners port)."""
        with self._lock:
            self._ingest()
            return self._processes.owners(pids)

    def kill(self, pid: int) -> None:
        """End simulated process `pid` as SIGKILL would: it leaves its GPU. Its PID is
        not the host's, so nothing is signalled. ProcessLookupError when none runs."""
        with self._lock:
            self._ingest()
            if not self._processes.end(pid):
                raise ProcessLookupError(pid, "no such simulated process")

    @property
    def refused(self) -> tuple[str, ...]:
        """One line per allocation refused past a cgroup's hard limit."""
        with self._lock:
            self._ingest()
            return tuple(self._refused)

    # The MemoryLimits port: the driver's per-cgroup limits, as r615 applies them.

    def memory_limits(self) -> FakeBackend:
        return self

    def limit_problem(self) -> str:
        """As a real driver of the node's version: r615 and later have the calls."""
        return driver_problem(self._snapshot.driver_version, has_calls=True)

    def set_memory_limit(self, gpu_uuid: str, cgroup: str, limit: Limit) -> None:
        with self._lock:
            self._limited_gpu(gpu_uuid)
            self._processes.set_limit(gpu_uuid, cgroup, limit)

    def memory_limit(self, gpu_uuid: str, cgroup: str) -> LimitReading:
        with self._lock:
            self._limited_gpu(gpu_uuid)
            limit = self._processes.limit(gpu_uuid, cgroup)
            used = self._processes.used_in(gpu_uuid, cgroup)
            if limit is None:
                return LimitReading(0, UNLIMITED, used)
            return LimitReading(limit.soft, limit.hard, used)

    def clear_memory_limit(self, gpu_uuid: str, cgroup: str) -> None:
        with self._lock:
            self._limited_gpu(gpu_uuid)
            self._processes.set_limit(gpu_uuid, cgroup, None)

    def _limited_gpu(self, gpu_uuid: str) -> None:
        """The GPU a limit call names, as the driver answers for it (holding the lock)."""
        self._ingest()
        gpu = self._snapshot.gpu_by_uuid(gpu_uuid)
        if gpu is None:
            raise BackendError(f"no GPU {gpu_uuid} on this node")
        if gpu.mig_enabled:
            raise BackendError(f"GPU {gpu.index}: memory limits are not supported with MIG")
        if gpu_uuid in self._lost:
            raise BackendError(f"GPU {gpu.index}: GPU is lost", transient=True)
        problem = self.limit_problem()
        if problem:
            raise BackendError(f"memory limits on GPU {gpu.index}: {problem}")

    # The MigControl port: MIG mode and instances (fake.mig).

    def mig_control(self) -> FakeBackend:
        return self

    def profiles(self, gpu_uuid: str) -> tuple[MigProfileSpec, ...]:
        with self._lock:
            self._ingest()
            return self._mig.profiles(gpu_uuid)

    def instances(self, gpu_uuid: str) -> tuple[GpuInstance, ...]:
        with self._lock:
            self._ingest()
            return self._mig.instances(gpu_uuid)

    def mig_mode(self, gpu_uuid: str) -> tuple[bool, bool]:
        with self._lock:
            self._ingest()
            return self._mig.mig_mode(gpu_uuid)

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        with self._lock:
            self._ingest()
            try:
                self._mig.set_mig_mode(gpu_uuid, enabled)
            finally:
                self._relayout()

    def create(self, gpu_uuid: str, profile: str, start: int) -> GpuInstance:
        with self._lock:
            self._ingest()
            try:
                return self._mig.create(gpu_uuid, profile, start)
            finally:
                self._relayout()

    def destroy(self, gpu_uuid: str, gi: int) -> None:
        with self._lock:
            self._ingest()
            try:
                self._mig.destroy(gpu_uuid, gi)
            finally:
                self._relayout()

    def _relayout(self) -> None:
        """The snapshot and the process table follow the MIG state (holding the lock)."""
        self._snapshot = self._mig.snapshot
        self._processes.relayout(self._snapshot)
        parents = {m.uuid: g.uuid for g in self._snapshot.gpus for m in g.mig_devices}
        self._parent = parents | {g.uuid: g.uuid for g in self._snapshot.gpus}

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._events is not None:
                self._events.close()
            self._events = None

    def _ingest(self) -> None:
        """Read new event lines, update health state and queue the events."""
        if self._events is None:
            return
        for number, line in self._events.new_lines():
            try:
                event = parse_event(line, self._snapshot)
            except ValueError as exc:
                self._warnings.append(f"{self._events.path}:{number}: {exc}; line skipped")
                _log.warning(
                    "fake_event_skipped", file=str(self._events.path), line=number, reason=str(exc)
                )
                continue
            if event is None:
                continue
            if isinstance(event, MigFault):
                self._mig.inject(event)
                continue
            if not isinstance(event, HealthEvent):
                refused = self._processes.apply(event)
                if refused is not None:
                    self._refused.append(refused)
                    _log.warning("fake_allocation_refused", detail=refused)
                continue
            if event.kind == "lost" or event.xid == FALLEN_OFF_THE_BUS_XID:
                self._lost.add(event.gpu_uuid)
            elif event.kind == "recovered":
                self._lost.discard(event.gpu_uuid)
            self._pending.append(event)
