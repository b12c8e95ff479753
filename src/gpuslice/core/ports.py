"""Ports: what the services need from the outside world, as Protocols."""

from __future__ import annotations

import asyncio
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.dra.claims import ClaimRef, PreparedClaim, PrepareResult
from gpuslice.core.dra.health import DeviceHealth
from gpuslice.core.dra.slices import SliceChange
from gpuslice.core.errors import GpusliceError
from gpuslice.core.isolation import HostFacts, Limit, LimitReading
from gpuslice.core.metrics import GpuRef, ResourceState
from gpuslice.core.mps import DaemonPlan, RunningDaemon
from gpuslice.core.resources import AdvertisedDevice, Resource
from gpuslice.core.response import AllocateOptions, ContainerAllocation
from gpuslice.core.settings import Settings
from gpuslice.core.usage import CheckpointEntry, ContainerDevices, ProcessOwner, ProcessSample

T = TypeVar("T")

# (directory, names or None for all) -> an async context yielding (name, "created" |
# "deleted") events (adapters.fswatch.DirWatcher).
DirEvents = AbstractAsyncContextManager[AsyncIterator[tuple[str, str]]]
DirWatch = Callable[[str, Collection[str] | None], DirEvents]


class GpuBackend(Protocol):
    """Source of hardware facts and health events. Calls may block; the
    services run them on one worker thread, never on the event loop."""

    def snapshot(self) -> HardwareSnapshot:
        """Enumerate the node's GPUs and MIG devices. Raises BackendError."""
        ...

    def wait_event(self, timeout_s: float) -> HealthEvent | None:
        """Block up to timeout_s for the next health event; None on timeout."""
        ...

    def probe(self, gpu_uuid: str) -> bool:
        """True when the GPU answers normally right now."""
        ...

    def processes(self) -> ProcessSample:
        """The processes on each GPU and MIG device now: per-process data only, not the
        inventory. A GPU that cannot be read carries its error; the call never fails
        for one GPU."""
        ...

    def close(self) -> None:
        """Release the backend (NVML shutdown, file handles)."""
        ...


class MemoryLimits(Protocol):
    """The driver's per-cgroup GPU memory limits (r615): the part of a GpuBackend that
    sets, reads and clears them. `cgroup` is the cgroup's full path as the host names it
    (/sys/fs/cgroup/...). Blocking, on the backend worker; BackendError when refused."""

    def limit_problem(self) -> str:
        """Why the driver cannot set limits ("" when it can)."""
        ...

    def set_memory_limit(self, gpu_uuid: str, cgroup: str, limit: Limit) -> None: ...

    def memory_limit(self, gpu_uuid: str, cgroup: str) -> LimitReading: ...

    def clear_memory_limit(self, gpu_uuid: str, cgroup: str) -> None: ...


class PodCgroups(Protocol):
    """The kubelet's pod cgroups on the host (adapters.cgroup_tree). Blocking reads."""

    def watched(self) -> tuple[str, ...]:
        """The directories pod cgroups appear in (the QoS levels of both drivers)."""
        ...

    def pods(self) -> dict[str, str]:
        """Pod UID -> its cgroup's full host path, for every pod cgroup there now."""
        ...

    def facts(self, driver: str) -> HostFacts:
        """The cgroup version and the dmem controller, with the driver's `driver` problem."""
        ...


class TimeSlicer(Protocol):
    """A GPU's compute-policy time slice, as `nvidia-smi compute-policy --set-timeslice`
    sets it (Default, Short, Medium, Long). Blocking: run on the backend's worker."""

    def set_time_slice(self, gpu_uuid: str, interval: str) -> None:
        """Raises BackendError."""
        ...

    def time_slice(self, gpu_uuid: str) -> str | None:
        """The interval last set here; None when unknown."""
        ...


class Host(Protocol):
    """The machine the agent runs on, real or simulated, chosen once (wiring.host): all
    that differs between the two. A new kind of host implements these."""

    def open_backend(self) -> GpuBackend:
        """The GPU backend (BackendError when it cannot start)."""
        ...

    def imex_present(self) -> frozenset[int]:
        """The IMEX channels whose device node exists."""
        ...

    def control_devices(self) -> tuple[str, ...]:
        """The driver's control device nodes present here, given to every container."""
        ...

    def extra_cdi_nodes(self) -> Mapping[str, tuple[str, ...]]:
        """Per optional CDI device kind (gdrcopy, gds, mofed): the device nodes present."""
        ...

    def machine_type(self, path: str) -> str | None:
        """The machine type read from `path`; None: the snapshot's own."""
        ...

    def process_owners(self) -> tuple[ProcessOwners | None, Callable[[int], None]]:
        """Who owns a GPU process (None: the backend's samples say) and how to kill one."""
        ...

    def mps_binary(self) -> list[str]:
        """The MPS control daemon's command line."""
        ...

    def time_slicer(self) -> TimeSlicer:
        """The GPUs' compute-policy time slice."""
        ...


class ProcessOwners(Protocol):
    """Which pod each process runs in: the cgroup reader, or the simulated backend."""

    def owners(self, pids: Collection[int]) -> Mapping[int, ProcessOwner]:
        """The pod of each of `pids` that runs in one; others are left out. Blocking."""
        ...


class PodResources(Protocol):
    """The kubelet's view of which container holds which devices."""

    async def list(self) -> tuple[ContainerDevices, ...]:
        """Every container's devices (PodResources List). Raises BackendError."""
        ...

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        """resource -> every device ID the kubelet can allocate. Raises BackendError."""
        ...

    def pod_uids(self) -> tuple[CheckpointEntry, ...]:
        """The pod UIDs of allocations (the kubelet's device checkpoint); () if unreadable."""
        ...


class PluginHandler(Protocol):
    """What one device-plugin gRPC server serves for one resource.

    The kubelet adapter translates protobuf to these calls; the services
    implement them over the core. InvalidRequest becomes INVALID_ARGUMENT.
    """

    @property
    def resource_name(self) -> str: ...

    def devices(self) -> tuple[tuple[AdvertisedDevice, bool], ...]:
        """Every advertised device with its health (True = healthy)."""
        ...

    @property
    def generation(self) -> int:
        """Bumped whenever devices() would return something different."""
        ...

    async def wait_changed(self, seen: int) -> int:
        """Return once generation != seen (at once if it already is)."""
        ...

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...

    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation: ...


class SocketTaken(GpusliceError):  # noqa: N818 - reads as what happened
    """Another live device plugin serves the endpoint's socket path: it is left alone."""


class PluginEndpoint(Protocol):
    """One served resource: its gRPC server, its socket and its kubelet registration.

    The server's crash watch is part of the contract: a server that stops serving
    without stop() being called is reported by down() and wait_down(), so whoever
    supervises it can restart it.
    """

    async def start(self) -> None:
        """Bind the socket and serve. Raises SocketTaken when another plugin serves
        that path now, another GpusliceError when it cannot be served."""
        ...

    async def register(self) -> None:
        """Register with the kubelet; raises on failure."""
        ...

    def socket_present(self) -> bool:
        """True while the socket file this server bound is in place."""
        ...

    def current(self) -> bool:
        """True while our socket is in place and our last Register call, answered or
        still in flight, went to the kubelet serving now."""
        ...

    def down(self) -> str | None:
        """Why the server stopped serving on its own since start(), or None."""
        ...

    async def wait_down(self) -> str:
        """Return why, once the server stopped serving on its own (call after start)."""
        ...

    async def wait_listed(self) -> None:
        """Return once the kubelet, since our last Register call, has opened ListAndWatch
        and been sent the list (at once when we do not register)."""
        ...

    def release_socket(self) -> None:
        """Remove our socket file but keep serving the connections already made (the
        kubelet's), so that a successor can serve the same path; stop() still ends it."""
        ...

    async def wait_dropped(self) -> None:
        """Return once the kubelet cancelled a ListAndWatch stream that we did not end
        (it dropped the resource; call after start, again for the next one)."""
        ...

    async def stop(self) -> None:
        """Stop serving and remove our socket; never raises for a server already down."""
        ...


class DirectoryClaim(Protocol):
    """The device-plugin directory, held by this agent alone until it hands it over."""

    def serving(self) -> None:
        """Say that every resource is registered (a predecessor may end its streams)."""
        ...

    async def hand_over(self) -> bool:
        """Release it (our sockets already removed) and return once a successor that
        took it serves, or at once when none does; True when one took over."""
        ...

    def release(self) -> None: ...


# (stop, told who it waits for) -> the claim, or None when stopped first.
ClaimDir = Callable[[asyncio.Event, Callable[[str], None]], Awaitable[DirectoryClaim | None]]


@dataclass(frozen=True)
class ConfigMapView:
    """A ConfigMap as the agent follows it: its data (None: the ConfigMap does not exist)
    and annotations, and `trouble`: why this may be stale (the watch is failing and is
    being retried; this is the last view read), None while the watch works."""

    data: Mapping[str, str] | None
    annotations: Mapping[str, str] = field(default_factory=dict)
    trouble: str | None = None


class NodeApi(Protocol):
    """The agent's view of the Kubernetes API: its own Node, its NodeFeature, Events,
    and the ConfigMap of per-node configs when it is read through the API."""

    async def node_labels(self, node: str) -> dict[str, str]:
        """The Node's labels now (a full read). Raises BackendError(transient=True)
        when the API cannot be reached."""
        ...

    def watch_node_labels(self, node: str) -> AsyncIterator[dict[str, str]]:
        """Yield the Node's labels after the first full read, then each time they
        change; resumes (re-reading) after a dropped watch or 410 Gone."""
        ...

    def watch_config_map(self, namespace: str, name: str) -> AsyncIterator[ConfigMapView]:
        """Yield the ConfigMap after the first full read (raising BackendError when that
        fails), then each time it or its trouble changes; resumes as the Node watch does."""
        ...

    @property
    def watch_trouble(self) -> str | None:
        """Why watches followed now are down (they are retried; what they last said
        serves), one line; None while every watch holds."""
        ...

    async def publish_node_feature(
        self, node: str, namespace: str, labels: Mapping[str, str]
    ) -> bool:
        """Create or update NodeFeature nvidia-features-for-<node> with `labels`;
        False when the stored object already had exactly these labels."""
        ...

    async def record_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        """A Kubernetes Event on the Node (best effort: never raises)."""
        ...

    async def report_config_problem(
        self, namespace: str, name: str, reason: str, message: str
    ) -> bool:
        """A problem of the shared ConfigMap, reported once for the whole cluster (one
        Warning Event on it, which every node finding the same problem shares); False when
        it could not be reported (best effort: never raises)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class PodEvents(Protocol):
    """Events about a Pod, in the Pod's namespace (the memory-budget watchdog's)."""

    async def record_pod_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, *, warning: bool
    ) -> None:
        """A Kubernetes Event on the Pod (best effort: never raises)."""
        ...


class LabelSink(Protocol):
    """Where node labels go: an NFD features.d file or a NodeFeature object."""

    async def publish(self, labels: Mapping[str, str]) -> bool:
        """Write `labels`; False when nothing changed and nothing was written."""
        ...

    async def remove(self) -> None: ...


class CdiStore(Protocol):
    """Where CDI specs go: the CDI spec directory."""

    async def sync(self, specs: Mapping[str, str]) -> tuple[str, ...]:
        """Hold exactly `specs` (file name -> content) among the files it wrote, rewriting
        only changed ones; returns the names written or deleted. Raises BackendError."""
        ...


class Metrics(Protocol):
    """What the services report for /metrics (core.metrics.NoMetrics records nothing).
    Every call is cheap, made on the loop, and never raises."""

    def request_observed(self, resource: str, method: str, seconds: float, outcome: str) -> None:
        """One Allocate or GetPreferredAllocation call and its outcome (core.metrics)."""
        ...

    def registered(self, resource: str) -> None:
        """A Register call the kubelet accepted."""
        ...

    def server_failed(self, resource: str) -> None:
        """A device-plugin server that could not start or went down on its own."""
        ...

    def kubelet_restart_seen(self) -> None: ...

    def xid_seen(self, gpu: GpuRef, xid: int, xid_class: str) -> None:
        """An XID event, with its class under the health policy (core.metrics.XID_*)."""
        ...

    def health_transition(self, gpu: GpuRef, device: str, transition: str, cause: str) -> None:
        """`device` (the GPU or a MIG device on it) was marked, escalated or recovered."""
        ...

    def config_applied(self, name: str) -> None: ...

    def config_rejected(self, name: str) -> None: ...

    def sampled(self, at_unix_s: float, interval_s: float) -> None:
        """A per-process sample succeeded at this wall-clock time; they are `interval_s` apart."""
        ...

    def sample_failed(self) -> None: ...

    def budget_action(self, gpu: GpuRef, resource: str, policy: str, outcome: str) -> None:
        """The memory-budget watchdog acted on a container over its budget on `gpu`."""
        ...


class MpsError(GpusliceError):
    """An MPS control daemon could not be started or did not answer."""


class MpsHostAbsent(MpsError):  # noqa: N818 - reads as what happened
    """`gpuslice mps-control` does not answer (not started yet, or restarting)."""


class MpsLauncher(Protocol):
    """Where MPS control daemons are started and watched (adapters.mps: from this
    process, or from `gpuslice mps-control`). Each method raises MpsError."""

    async def start(self, plan: DaemonPlan) -> RunningDaemon:
        """Start the daemon of `plan` (no limits set yet)."""
        ...

    async def running(self, root: str) -> RunningDaemon | None:
        """The daemon running in the resource directory `root`, if any."""
        ...

    async def found(self, mps_root: str) -> tuple[RunningDaemon, ...]:
        """Every daemon running under `mps_root`."""
        ...

    async def exited(self, daemon: RunningDaemon) -> None:
        """Return once `daemon` exits (or can no longer be watched: look again)."""
        ...


class MpsCommands(Protocol):
    """Commands to the running daemon of a plan (adapters.mps.ControlCommands)."""

    async def limit(self, plan: DaemonPlan) -> None:
        """Give the daemon's new clients `plan`'s limits, read back; MpsError otherwise."""
        ...

    async def clients(self, plan: DaemonPlan) -> int:
        """How many clients its servers have now."""
        ...

    async def quit(self, plan: DaemonPlan) -> None:
        """Ask it to end (it waits for its clients)."""
        ...


# --- One node, several front-ends -------------------------------------------------------
#
# The node's device state (services.node_devices.NodeDevices) is the one owner of what
# the node holds: the backend and its worker thread, the hardware snapshot, the settings
# in force, health and every other hold on a device, the CDI specs and the MPS daemons.
# A front-end is one way of telling the kubelet about those devices (the device-plugin
# API today; DRA next). The agent (services.agent) converges: desired settings go to the
# node state first, then to each front-end. A new front-end is a new package under
# gpuslice.frontends implementing FrontEnd over NodeState, plus its lines in wiring.

# Told each new merged unhealthy set; returns the names of what it serves that changed.
UnhealthyListener = Callable[[frozenset[str]], Iterable[str]]


@dataclass(frozen=True)
class DevicePlan:
    """What one front-end is about to serve, as NodeState.plan_devices checked it."""

    by: str  # the front-end's name
    resources: tuple[Resource, ...]
    allocate: AllocateOptions
    daemons: tuple[DaemonPlan, ...] = ()  # the MPS control daemons they need


class NodeState(Protocol):
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

    def hold(self, devices: frozenset[str], *, by: str) -> None:
        """Hold `devices` Unhealthy on behalf of `by`, replacing what `by` held; health's
        updates never clear a hold, and a holder never clears another's."""
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


class HealthWatch(Protocol):
    """The node while its backend is open (AgentNode.session)."""

    def watching_health(self) -> AbstractAsyncContextManager[None]:
        """Health (events and re-probes) while the block runs; after the first commit."""
        ...


class AgentNode(Protocol):
    """What the agent drives of the node's device state (services.node_devices): one
    session that owns the node's lifecycle in order, and the read-commit step."""

    def session(
        self, hand_over: Callable[[], Awaitable[None]]
    ) -> AbstractAsyncContextManager[HealthWatch]:
        """The backend open for the block (GpusliceError on entry when it cannot open);
        on the way out `hand_over` runs once the MPS daemons run on unsupervised."""
        ...

    async def read(self) -> HardwareSnapshot:
        """The hardware now. Raises BackendError."""
        ...

    def commit(self, snapshot: HardwareSnapshot, settings: Settings) -> None:
        """Make both the ones in force (checked by every front-end)."""
        ...

    @property
    def snapshot(self) -> HardwareSnapshot: ...

    @property
    def resources(self) -> tuple[Resource, ...]:
        """What every front-end serves now."""
        ...

    async def follow_holds(self) -> None:
        """Check the holds against what is served; until cancelled."""
        ...


class FrontEnd(Protocol):
    """One way the kubelet learns of the node's devices (services.agent drives it).

    It is given the NodeState when it is built, and reports back through `ready`,
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


class DraHandler(Protocol):
    """What the DRA kubelet plugin serves (frontends.dra.DraDriver); the kubelet adapter
    translates protobuf to these calls. Every claim asked for gets an answer."""

    @property
    def driver(self) -> str: ...

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Claim UID -> its devices or why not (idempotent, by UID)."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> "" when it is unprepared now, else why not (idempotent)."""
        ...

    def health(self) -> tuple[DeviceHealth, ...]:
        """Every published device's health (the complete list)."""
        ...

    @property
    def health_generation(self) -> int: ...

    async def wait_health_changed(self, seen: int) -> int:
        """Return once health_generation != seen."""
        ...


class DraEndpoint(Protocol):
    """The DRA plugin's two sockets: registration (plugins_registry) and service."""

    async def start(self) -> None:
        """Bind both sockets and serve. Raises GpusliceError when they cannot be served."""
        ...

    def sockets_present(self) -> bool:
        """True while both socket files we bound are in place."""
        ...

    def registered(self) -> bool:
        """The kubelet told us (NotifyRegistrationStatus) that it registered the plugin."""
        ...

    @property
    def registration_changes(self) -> int:
        """How many times the kubelet told a registration outcome or a registered
        plugin stopped serving."""
        ...

    async def wait_registration(self, seen: int) -> int:
        """Until registration_changes is no longer `seen`; the new count."""
        ...

    async def stop(self) -> None:
        """Stop serving and remove our sockets."""
        ...


class ClaimCheckpoint(Protocol):
    """The prepared claims on disk, so unprepare works after an agent restart."""

    async def load(self) -> dict[str, PreparedClaim]:
        """Claim UID -> prepared claim; {} when there is none. Raises BackendError when
        the file is unreadable or not a checkpoint."""
        ...

    async def save(self, claims: Mapping[str, PreparedClaim], *, durable: bool = True) -> None:
        """Replace the checkpoint atomically (and, when `durable`, so that it survives a
        crash of the node). Raises BackendError."""
        ...


class ClaimSpecs(Protocol):
    """Per-claim CDI spec files in the CDI spec directory."""

    async def write(self, name: str, text: str) -> None:
        """Raises BackendError."""
        ...

    async def remove(self, name: str) -> None:
        """Gone afterwards (also when it was never there). Raises BackendError."""
        ...

    async def names(self) -> list[str]:
        """The file names in the directory ([] when it does not exist). Raises
        BackendError."""
        ...


class DraApi(Protocol):
    """The Kubernetes API as the DRA plugin uses it: its node's ResourceSlices and the
    ResourceClaims it prepares."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, object]:
        """The ResourceClaim as JSON. Raises BackendError (NotFound when absent)."""
        ...

    async def list_slices(self, node: str, driver: str) -> list[dict[str, object]]:
        """This node's slices of `driver`. Raises BackendError."""
        ...

    async def put_slice(
        self, body: dict[str, object], current: dict[str, object] | None
    ) -> dict[str, object]:
        """Create `body`, or replace `current` (same name) with it; the stored object.
        Raises BackendError."""
        ...

    async def delete_slice(self, name: str) -> None:
        """Raises BackendError; a slice already gone is fine."""
        ...

    def watch_slices(self, node: str, driver: str) -> AsyncIterator[SliceChange]:
        """One watch of this node's slices of `driver`: those there now as ADDED, then
        every change, until the server ends it. Raises BackendError when it fails."""
        ...
