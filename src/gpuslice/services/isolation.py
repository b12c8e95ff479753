"""Per-pod GPU memory limits kept in force by the driver (r615 per-cgroup limits).

A pod's limit goes on its pod-level cgroup as soon as that cgroup appears: the kubelet
creates it after admission (Allocate, and the device checkpoint that records the pod's
devices) and before the pod's sandbox and containers, so the limit is normally in force
before any of its containers runs (the kubelet does not wait for it; the margin is measured
in docs/memory-isolation.md). Each pass, on the backend worker: the cgroup tree's pods, the
kubelet's checkpoint (which pod holds which share; also the record rebuilt from after an
agent restart) and the policy give the limits wanted; those that differ are set, those no
longer wanted cleared. A pod's cgroup removed takes its limits with it.

Passes run when a QoS directory or the checkpoint changes (inotify, else polling), when the
settings change, and every `resync_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import BackendError
from gpuslice.core.isolation import (
    ENFORCING,
    GpuIsolation,
    IsolationView,
    Limit,
    PodLimit,
    limited_gpus,
    missing_line,
    mps_gpus,
    node_mode,
    pod_limits,
)
from gpuslice.core.isolation import detect as detect_modes
from gpuslice.core.isolation import labels as isolation_labels
from gpuslice.core.ports import DirWatch, GpuBackend, MemoryLimits, PodCgroups
from gpuslice.core.resources import Resource
from gpuslice.core.settings import Settings
from gpuslice.core.usage import CheckpointEntry
from gpuslice.core.waiting import first_of
from gpuslice.services.claim_shares import ClaimShares

log = structlog.get_logger("gpuslice.isolation")

NO_LIMITS = "the GPU backend cannot set memory limits"


class IsolatedNode(Protocol):
    """What the service reads of the node state (services.node_devices.NodeDevices)."""

    @property
    def snapshot(self) -> HardwareSnapshot: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def resources(self) -> tuple[Resource, ...]: ...
    @property
    def generation(self) -> int: ...
    async def wait_changed(self, seen: int) -> int: ...
    async def on_backend(self, fn: Callable[[GpuBackend], Any]) -> Any: ...


@dataclass(frozen=True, slots=True)
class Inputs:
    """What one pass reads from the loop's side, taken before it goes to the worker."""

    snapshot: HardwareSnapshot
    settings: Settings
    resources: tuple[Resource, ...]
    claimed: dict[str, dict[str, Limit]]  # pod UID -> GPU -> its DRA claims' limits
    applied: dict[str, Applied]


@dataclass(frozen=True, slots=True)
class Pass:
    gpus: tuple[GpuIsolation, ...]
    applied: dict[str, Applied]
    errors: list[str]
    kubepods: tuple[str, ...]  # where the pods' cgroups were looked for
    missing: str  # why none can be found


@dataclass(frozen=True, slots=True)
class Applied:
    cgroup: str
    limits: Mapping[str, Limit]  # GPU UUID -> the limit in force there


class Isolation:
    def __init__(
        self,
        node: IsolatedNode,
        cgroups: PodCgroups,
        checkpoint: Callable[[], tuple[CheckpointEntry, ...]],
        watch: DirWatch,
        *,
        also_watch: tuple[tuple[str, frozenset[str]], ...] = (),  # (directory, names)
        resync_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        claims: ClaimShares | None = None,  # what DRA prepared, told by its front-end
    ) -> None:
        self._node = node
        self._cgroups = cgroups
        self._checkpoint = checkpoint
        self._watch = watch
        self._also = also_watch
        self.resync_s = resync_s
        self._clock = clock
        self.gpus: tuple[GpuIsolation, ...] = ()
        self.applied: dict[str, Applied] = {}  # pod UID ->
        self.in_force_at: dict[str, float] = {}  # pod UID -> when its limits were first set
        self.error: str | None = None
        self.kubepods: tuple[str, ...] = ()
        self.pods_missing = ""  # why no pod cgroup can be found: nothing is limited
        self.passes = 0
        self.notify: Callable[[], None] | None = None  # told when the node's mode changes
        self.claims = claims if claims is not None else ClaimShares()
        # Each pod's limits as last computed, by its checkpoint entries; valid while the
        # served resources (by identity), the policy and the enforcing GPUs stay the same.
        self._basis: object = None
        self._computed: dict[str, tuple[tuple[CheckpointEntry, ...], dict[str, Limit]]] = {}
        self.claims.changed = self.nudge
        self._wake = asyncio.Event()

    # --- what others read --------------------------------------------------------------

    def enforced(self) -> frozenset[str]:
        """GPUs whose pods' memory the driver bounds now (the watchdog steps back there)."""
        return limited_gpus(self.gpus, self._node.settings.memory, self.pods_missing)

    def view(self) -> IsolationView:
        gpus = {g.uuid: g for g in self._node.snapshot.gpus} if self.gpus else {}
        return IsolationView(
            tuple((g, gpus[g.uuid].name) for g in self.gpus if g.uuid in gpus),
            tuple(
                PodLimit(uid, gpu, limit)
                for uid, a in sorted(self.applied.items())
                for gpu, limit in sorted(a.limits.items())
            ),
        )

    def labels(self) -> dict[str, str]:
        return isolation_labels(self.gpus)

    def status(self) -> dict[str, object]:
        """The readiness detail: reported, never a reason to be unready."""
        detail: dict[str, object] = {
            "enabled": self._node.settings.memory.enabled,
            "mode": node_mode(self.gpus),
            "gpus": {str(g.index): g.mode for g in self.gpus},
            "limitedPods": len([a for a in self.applied.values() if a.limits]),
        }
        missing = missing_line(self.gpus)
        if missing:
            detail["missing"] = missing
        if self.kubepods:
            detail["kubepods"] = list(self.kubepods)
        if self.pods_missing:
            detail["podCgroups"] = self.pods_missing
        if self.error:
            detail["error"] = self.error
        return detail

    def usage(self, backend: GpuBackend) -> dict[tuple[str, str], int]:
        """(pod UID, GPU UUID) -> currentUsed of each limit in force (on the worker)."""
        limits = backend.memory_limits()
        out: dict[tuple[str, str], int] = {}
        if limits is None:
            return out
        for uid, applied in list(self.applied.items()):
            for gpu in applied.limits:
                with contextlib.suppress(BackendError):
                    out[(uid, gpu)] = limits.memory_limit(gpu, applied.cgroup).used
        return out

    def nudge(self) -> None:
        self._wake.set()

    # --- the loop ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Converge on every change until `stop`; limits stay with their pods after it
        (a restarted agent finds them and takes over)."""
        async with contextlib.AsyncExitStack() as stack:
            watched = await asyncio.to_thread(self._cgroups.watched)  # may search the tree
            dirs = [(d, None) for d in watched] + list(self._also)
            watchers = [await stack.enter_async_context(self._watch(d, n)) for d, n in dirs]
            async with asyncio.TaskGroup() as tasks:
                followers = [tasks.create_task(self._follow(w)) for w in watchers]
                followers.append(tasks.create_task(self._follow_node()))
                while not stop.is_set():
                    self._wake.clear()
                    await self.converge()
                    await first_of(stop.wait(), self._wake.wait(), timeout_s=self.resync_s)
                for task in followers:
                    task.cancel()

    async def _follow(self, events: Any) -> None:
        async for _ in events:
            self._wake.set()

    async def _follow_node(self) -> None:
        seen = self._node.generation
        while True:
            seen = await self._node.wait_changed(seen)
            self._wake.set()

    async def converge(self) -> None:
        """One pass: read and set on the backend worker, then commit what is in force
        here on the loop (what others read never changes under them). A backend that is
        not open yet is tried again at the next pass."""
        node = self._node
        inputs = Inputs(
            node.snapshot, node.settings, node.resources, self.claims.by_pod(), dict(self.applied)
        )
        first = self.passes == 0
        before = self.labels()
        try:
            done: Pass = await node.on_backend(lambda b: self._pass(b, inputs, first))
        except BackendError as exc:
            self._failed(str(exc))
            return
        except OSError as exc:  # the host's cgroup tree or the checkpoint cannot be read
            self._failed(f"memory limits not converged: {exc}")
            return
        now = self._clock()
        self.gpus, self.applied = done.gpus, done.applied
        self.kubepods, self.pods_missing = done.kubepods, done.missing
        for uid in self.in_force_at.keys() - done.applied.keys():
            del self.in_force_at[uid]
        for uid, applied in done.applied.items():
            if applied.limits and uid not in self.in_force_at:
                self.in_force_at[uid] = now
        self.passes += 1
        if done.errors:
            self._failed(done.errors[0])
        elif self.error is not None:
            log.info("memory_limits_recovered")
            self.error = None
        if self.labels() != before and self.notify is not None:
            self.notify()

    def _pass(self, backend: GpuBackend, inputs: Inputs, first: bool) -> Pass:
        """On the worker: the modes, the pods' cgroups, the kubelet's checkpoint; the
        limits that differ set, those no longer wanted cleared."""
        limits = backend.memory_limits()
        problem = limit_problem(backend)
        resources, policy = inputs.resources, inputs.settings.memory
        gpus = detect_modes(inputs.snapshot, self._cgroups.facts(problem), mps_gpus(resources))
        enforcing = [g.uuid for g in gpus if g.mode in ENFORCING]
        pods = self._cgroups.pods()
        wanted: dict[str, dict[str, Limit]] = {}  # pods the kubelet's records explain
        if policy.enabled and limits is not None:
            by_pod: dict[str, list[CheckpointEntry]] = defaultdict(list)
            for entry in self._checkpoint():
                if entry.pod_uid in pods:
                    by_pod[entry.pod_uid].append(entry)
            basis = (tuple(map(id, resources)), policy, tuple(enforcing))
            if basis != self._basis:  # what each pod's limits are computed from changed
                self._basis, self._computed = basis, {}
            computed = {}
            for uid, entries in by_pod.items():
                key = tuple(entries)
                done = self._computed.get(uid)
                if done is None or done[0] != key:
                    want = pod_limits(resources, entries, policy)
                    done = (key, {g: lim for g, lim in want.items() if g in enforcing})
                computed[uid] = done
                wanted[uid] = dict(done[1])
            self._computed = computed  # the worker's own: passes run one at a time
            for uid, want in inputs.claimed.items():
                mine = wanted.setdefault(uid, {})
                for g, lim in want.items():
                    if g in enforcing:
                        mine[g] = mine[g] + lim if g in mine else lim
        for uid in sorted(inputs.applied.keys() - pods.keys()):
            log.info("memory_limits_released", pod_uid=uid)  # gone with its cgroup
        applied: dict[str, Applied] = {}
        errors: list[str] = []
        for uid, cgroup in pods.items():
            held = inputs.applied.get(uid)
            have = dict(held.limits) if held is not None and held.cgroup == cgroup else {}
            if first and limits is not None:  # after a restart: what a predecessor set
                have = _in_force(limits, cgroup, enforcing)
            # A pod neither record explains (a claim prepared before this agent started)
            # keeps what it has: its cgroup's removal clears it.
            want = wanted.get(uid, have)
            if limits is not None:
                errors += _converge_pod(limits, uid, cgroup, have, want)
            if have or held is not None:
                applied[uid] = Applied(cgroup, have)
        return Pass(gpus, applied, errors, self._cgroups.kubepods(), self._cgroups.missing())

    def _failed(self, error: str) -> None:
        if error != self.error:
            log.warning("memory_limits_failed", error=error)
        self.error = error


def _converge_pod(
    limits: MemoryLimits, uid: str, cgroup: str, have: dict[str, Limit], want: dict[str, Limit]
) -> list[str]:
    """Set what differs and clear what is no longer wanted; `have` is updated to what is
    in force. Returns the errors."""
    errors = []
    for gpu, limit in sorted(want.items()):
        if have.get(gpu) == limit:
            continue
        try:
            limits.set_memory_limit(gpu, cgroup, limit)
        except BackendError as exc:
            errors.append(str(exc))
            continue
        have[gpu] = limit
        log.info("memory_limit_set", pod_uid=uid, gpu=gpu, hard=limit.hard, soft=limit.soft)
    for gpu in sorted(have.keys() - want.keys()):
        try:
            limits.clear_memory_limit(gpu, cgroup)
        except BackendError as exc:
            errors.append(str(exc))
            continue
        del have[gpu]
        log.info("memory_limit_cleared", pod_uid=uid, gpu=gpu)
    return errors


def _in_force(limits: MemoryLimits, cgroup: str, gpus: list[str]) -> dict[str, Limit]:
    out = {}
    for gpu in gpus:
        with contextlib.suppress(BackendError):
            reading = limits.memory_limit(gpu, cgroup)
            if reading.limited:
                out[gpu] = Limit(reading.hard, reading.soft)
    return out


def limit_problem(backend: GpuBackend) -> str:
    """Why the backend cannot set per-cgroup memory limits ("" when it can)."""
    limits = backend.memory_limits()
    return NO_LIMITS if limits is None else limits.limit_problem()
