"""Ports: one node, several front-ends (the node's device state, what the agent drives of
it, the front-end port)."""

from __future__ import annotations

import asyncio
from collections.abc import (
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.errors import GpusliceError
from gpuslice.core.metrics import ResourceState
from gpuslice.core.mps import DaemonPlan
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions
from gpuslice.core.settings import Settings

T = TypeVar("T")

# --- One node, several front-ends -------------------------------------------------------
#
# The node's device state (services.node_devices.NodeDevices) is the one owner of what
# the node holds: what it knows (services.node_state: the hardware snapshot, the settings
# in force, health and every other hold on a device) and what runs on it (the backend and
# its worker thread, the CDI specs, the MPS daemons, health's watch, in a session).
# A front-end is one way of telling the kubelet about those devices (the device-plugin
# API today; DRA next). The agent (services.agent) converges: desired settings go to the
# node state first, then to each front-end. A new front-end is a new package under
# gpuslice.frontends implementing FrontEnd over NodeView, plus its lines in wiring.

# What runs beside the agent once it serves, owned by the node's session (OpenNode.serving).
Background = Sequence[asyncio.Task[None]]

# Told each new merged unhealthy set; returns the names of what it serves that changed.
UnhealthyListener = Callable[[frozenset[str]], Iterable[str]]


@dataclass(frozen=True)
class DevicePlan:
    """What one front-end is about to serve, as NodeView.plan_devices checked it."""

    by: str  # the front-end's name
    resources: tuple[Resource, ...]
    allocate: AllocateOptions
    daemons: tuple[DaemonPlan, ...] = ()  # the MPS control daemons they need


class NodeView(Protocol):
    """What the node state gives a front-end. One per node, shared by every front-end;
    read and called on the event loop only. Nothing in it is specific to one front-end.

    - `snapshot` and `settings`: the hardware and the settings in force, committed
      together by the agent before it asks the front-ends to serve them;
    - `unhealthy`: every device (GPU or MIG UUID) that must not be handed out now: health
      (by "health") merged with every hold (`held`: by "watchdog", "moved", "mps", ...);
    - `generation` / `wait_changed`: a number bumped on every change of the above;
      `on_unhealthy` is told each new merged set synchronously, as it changes;
    - `plan_devices` / `provide`: CDI specs and MPS daemons for what a front-end serves
      (and the holds on devices still in use under another resource);
    - `call`: a function run on the backend's one worker thread.
    """

    @property
    def generation(self) -> int:
        """Bumped whenever snapshot, settings, unhealthy or held change."""
        ...

    async def wait_changed(self, seen: int) -> int:
        """Return the generation once it is not `seen` (at once if it already is not)."""
        ...

    @property
    def snapshot(self) -> HardwareSnapshot:
        """The hardware as last read (after the first commit)."""
        ...

    @property
    def settings(self) -> Settings:
        """The settings in force (after the first commit)."""
        ...

    @property
    def unhealthy(self) -> frozenset[str]:
        """Health's marks and every hold, merged."""
        ...

    @property
    def held(self) -> Mapping[str, frozenset[str]]:
        """Holder -> the devices it holds Unhealthy ("health" is health's own marks)."""
        ...

    def hold(self, devices: frozenset[str], *, by: str) -> Iterable[str]:
        """Hold `devices` Unhealthy on behalf of `by`, replacing what `by` held; health's
        updates never clear a hold, and a holder never clears another's. Returns the
        served names whose lists changed."""
        ...

    def on_unhealthy(self, listener: UnhealthyListener) -> None:
        """Call `listener(unhealthy)` on every change of the merged set, synchronously
        (a front-end's lists change before the change is logged)."""
        ...

    def on_toolkit(
        self, listener: Callable[[ToolkitDevices], None], *, always: bool = False
    ) -> None:
        """Call `listener(found)` whenever the NVIDIA Container Toolkit's CDI spec files
        change so that its devices differ (it appeared, went, or names others): while the
        settings use a cdi-* strategy, or `always` (a front-end that names them anyway)."""
        ...

    def plan_devices(
        self,
        by: str,
        snapshot: HardwareSnapshot,
        settings: Settings,
        resources: Sequence[Resource],
    ) -> DevicePlan:
        """What front-end `by` serving `resources` needs from the node (the MPS daemons'
        plans), checked before anything changes. Raises HardwareError (MPS on a
        MIG-enabled GPU, too many clients)."""
        ...

    async def provide(self, plan: DevicePlan) -> AllocateOptions:
        """Make `plan` true before its resources are served, for every front-end's
        resources together: holds on devices still in use under another resource
        (by "moved"), the CDI specs, the MPS daemons (whose GPUs are held by "mps" while
        a daemon does not answer). Returns the allocate options to serve with (CDI adds
        the NVIDIA Container Toolkit's device names)."""
        ...

    async def call(self, fn: Callable[[], T]) -> T:
        """fn() on the backend's worker thread, as the node state's own calls run."""
        ...


@dataclass(frozen=True, slots=True)
class Committed:
    """Hardware and settings made the ones in force: only OpenNode.commit makes one."""

    snapshot: HardwareSnapshot
    settings: Settings


class OpenNode(Protocol):
    """The node while its backend is open (AgentNode.session): it reads and commits, and
    runs what needs the first commit (health, the holds' checks) while `serving` does."""

    async def read(self) -> HardwareSnapshot:
        """The hardware now. Raises BackendError."""
        ...

    def commit(self, snapshot: HardwareSnapshot, settings: Settings) -> Committed:
        """Make both the ones in force (checked by every front-end)."""
        ...

    def serving(
        self, first: Committed
    ) -> AbstractAsyncContextManager[Sequence[asyncio.Task[None]]]:
        """Health (events and re-probes, by `first`'s settings) and the holds' checks while
        the block runs, started and stopped by the session; the block gets their tasks,
        to watch (one that ends is a crash), never to cancel."""
        ...


class AgentNode(Protocol):
    """What the agent drives of the node's device state (services.node_devices): one
    session that owns the node's lifecycle in order."""

    def session(
        self, hand_over: Callable[[], Awaitable[None]]
    ) -> AbstractAsyncContextManager[OpenNode]:
        """The backend open for the block (GpusliceError on entry when it cannot open);
        on the way out `hand_over` runs once the MPS daemons run on unsupervised."""
        ...

    @property
    def snapshot(self) -> HardwareSnapshot: ...

    @property
    def resources(self) -> tuple[Resource, ...]:
        """What every front-end serves now."""
        ...


class FrontEnd(Protocol):
    """One way the kubelet learns of the node's devices (services.agent drives it).

    It is given the NodeView when it is built, and reports back through `ready`,
    `status`, `failed` and `error`. The agent calls `start` once, then `prepare` with each
    new hardware snapshot and settings (before they are committed) and the step it returns
    once they are, `run` beside them after the first step, `stop` at the end (also after
    a failed start or first step) and, once the node's daemons are stopped, `release`.
    `start` may wait (for a predecessor to let go); the agent cancels it on a stop.
    """

    @property
    def name(self) -> str:
        """Short and stable ("device-plugin"): readiness nests its status under it, and log
        lines name it."""
        ...

    async def start(self) -> None:
        """Begin following the outside world before anything is served (a directory
        watch that must see a kubelet starting meanwhile)."""
        ...

    def prepare(self, snapshot: HardwareSnapshot, settings: Settings) -> FrontEndStep:
        """Check that `settings` can be served on `snapshot` and return the step that serves
        them. Raises GpusliceError (HardwareError, ConfigError) to refuse them: nothing
        served changes then, on any front-end."""
        ...

    async def run(self) -> None:
        """Follow the outside world (the kubelet's sockets, ...) until cancelled. Returning
        or raising is a crash: the agent stops and the process exits non-zero."""
        ...

    def ready(self) -> bool:
        """Everything served is known to the kubelet (registered, published)."""
        ...

    @property
    def waiting_for(self) -> str | None:
        """What it waits for before it can serve (the agent it replaces, still holding the
        kubelet's directory or sockets); None when it does not wait. Readiness counts a
        front-end waiting for its predecessor as started."""
        ...

    def resource_states(self) -> Sequence[ResourceState]:
        """What each of its resources advertises now (for /metrics)."""
        ...

    def status(self) -> Mapping[str, object]:
        """The readiness detail of this front-end (what /readyz shows under its name)."""
        ...

    @property
    def failed(self) -> asyncio.Event:
        """Set once the front-end gave up (a restart budget spent); `error` says why."""
        ...

    @property
    def error(self) -> GpusliceError | None: ...

    async def stop(self) -> None:
        """Stop serving, remove what it created for the kubelet (sockets, ...) and stop
        following the outside world."""
        ...

    def release(self) -> None:
        """The last call, once the node's daemons are stopped too: let go of what a
        successor waits for (the device-plugin directory's claim)."""
        ...


class FrontEndStep(Protocol):
    """What FrontEnd.prepare returns: called once the settings are committed."""

    async def __call__(self) -> None:
        """Serve the prepared settings; returns once they are served (may still raise
        GpusliceError, reported as a refused config)."""


class CdiStore(Protocol):
    """Where CDI specs go: the CDI spec directory."""

    async def sync(self, specs: Mapping[str, str]) -> tuple[str, ...]:
        """Hold exactly `specs` (file name -> content) among the files it wrote, rewriting
        only changed ones; returns the names written or deleted. Raises BackendError."""
        ...
