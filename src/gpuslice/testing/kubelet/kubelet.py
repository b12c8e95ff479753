"""A kubelet stand-in: the device manager's side of the device-plugin protocol.

Test and demo code, never a replacement for the kubelet. Over real unix sockets
it serves Registration on <dir>/kubelet.sock, dials each registered plugin, keeps
its ListAndWatch device list, admits pods the way the kubelet does (preferred
allocation, then Allocate), checkpoints allocations and simulates restarts. With
`pod_resources_socket` it also serves the PodResources API there, from what it
admitted. It keeps each resource's current client as the kubelet's device manager does
(v1.26 on): made current by a Register call before it is dialled, removed by a failed dial
or options call, and disconnected by any stream of the resource that ends; with
`register_after_connect`, made current only once connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import grpc
import structlog

from gpuslice.adapters.deviceplugin.api import KUBELET_SOCKET_NAME, pb, pb_grpc, unix_target
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2_grpc as pr_grpc
from gpuslice.core.response import ContainerAllocation
from gpuslice.testing.kubelet import checkpoint
from gpuslice.testing.kubelet.admission import allocate_container
from gpuslice.testing.kubelet.endpoint import DialledPlugin
from gpuslice.testing.kubelet.names import registration_problem
from gpuslice.testing.kubelet.podresources import PodResourcesServicer
from gpuslice.testing.kubelet.records import (
    AdmittedContainer,
    DeviceState,
    Disconnect,
    InsufficientResourceError,
    NodeStatus,
    PluginOptions,
    RegistrationRecord,
    StaleStream,
    StandinError,
)

_log = structlog.get_logger()
DIAL_TIMEOUT_S = 10.0  # the kubelet's blocking dial of a plugin (and here its options call)


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, standin: KubeletStandin) -> None:
        self._standin = standin

    async def Register(  # noqa: N802
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.Empty:
        problem = await self._standin._register(request)
        if problem:
            # The kubelet answers with a plain Go error, which gRPC sends as UNKNOWN.
            await context.abort(grpc.StatusCode.UNKNOWN, problem)
        return pb.Empty()


class KubeletStandin:
    """Behaves like the kubelet's device manager on `plugin_dir`.

    Use `async with KubeletStandin(dir) as kubelet:` or start()/stop(). State
    changes wake `wait_for`; `registrations`, `disconnects` and `stale_streams` are
    logs for assertions.
    """

    def __init__(
        self,
        plugin_dir: str,
        pod_resources_socket: str | None = None,
        *,
        register_after_connect: bool = False,
        dial_timeout_s: float = DIAL_TIMEOUT_S,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.register_after_connect = register_after_connect
        self.dial_timeout_s = dial_timeout_s
        self.pod_resources_socket = pod_resources_socket
        self.socket_path = os.path.join(plugin_dir, KUBELET_SOCKET_NAME)
        self.checkpoint_path = os.path.join(plugin_dir, checkpoint.CHECKPOINT_NAME)
        self.registrations: list[RegistrationRecord] = []
        self.stale_streams: list[StaleStream] = []
        self.disconnects: list[Disconnect] = []
        self.restarts = 0
        # As the kubelet's two maps: the resource's current client (set when Register
        # comes in, removed when it is disconnected) and its endpoint (set once the
        # client answered its options; marked stopped when a client is disconnected).
        self._clients: dict[str, DialledPlugin] = {}
        self._endpoints: dict[str, DialledPlugin] = {}
        self._dialled: list[DialledPlugin] = []  # every connection, closed at stop()
        self._devices: dict[str, dict[str, DeviceState]] = {}  # resource -> its devices
        self._dropped_at: dict[str, float] = {}  # resource -> when a disconnect zeroed it
        self._unserved: dict[str, float] = {}  # resource -> seconds at 0 after disconnects
        self._state = checkpoint.Checkpoint()
        self._server: grpc.aio.Server | None = None
        self._cond = asyncio.Condition()

    async def __aenter__(self) -> KubeletStandin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # lifecycle

    async def start(self) -> None:
        """Like a starting kubelet: clear every socket in the directory, load the
        checkpoint, then serve Registration on kubelet.sock."""
        if self._server is not None:
            raise StandinError("kubelet stand-in already started")
        os.makedirs(self.plugin_dir, exist_ok=True)
        self._delete_sockets()
        self._state = checkpoint.load(self.checkpoint_path)
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        sockets = [self.socket_path]
        if self.pod_resources_socket is not None:
            lister = PodResourcesServicer(self.allocations, self._allocatable)
            pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)
            os.makedirs(os.path.dirname(self.pod_resources_socket), exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.pod_resources_socket)
            sockets.append(self.pod_resources_socket)
        for path in sockets:
            try:
                server.add_insecure_port(unix_target(path))
            except RuntimeError as exc:
                await server.stop(None)
                raise StandinError(f"cannot serve {path}: {exc}") from None
        await server.start()
        self._server = server
        _log.info("standin_started", socket=self.socket_path)
        await self._notify()

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection; leaves no tasks or channels."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
        endpoints, self._dialled = self._dialled, []
        self._clients, self._endpoints, self._devices = {}, {}, {}
        for ep in endpoints:
            await ep.close()
        for path in (self.socket_path, self.pod_resources_socket):
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        await self._notify()

    async def restart(self, delay: float = 0.0) -> None:
        """Simulate a kubelet restart: stop, delete every socket in the directory
        (plugins' included), wait `delay` seconds, then create kubelet.sock again."""
        await self.stop()
        self._delete_sockets()
        self.restarts += 1
        _log.info("standin_restarting", delay=delay)
        if delay > 0:
            await asyncio.sleep(delay)
        await self.start()

    @property
    def serving(self) -> bool:
        return self._server is not None

    def _delete_sockets(self) -> None:
        with contextlib.suppress(FileNotFoundError), os.scandir(self.plugin_dir) as entries:
            for entry in entries:
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    # registration

    async def _register(self, req: pb.RegisterRequest) -> str | None:
        """Handle Register as the kubelet's connectClient does (Register calls run side by
        side, as there): the client becomes the resource's current one before it is
        dialled (registerClient), then the dial and the options call (client.Connect);
        a failure removes the resource's current client, whichever it is then
        (deregisterClient), and leaves its endpoint alone. Returns the kubelet's error
        text, or None when accepted. With `register_after_connect` the client becomes
        current only once connected (an order some kubelet versions may have)."""
        problem = registration_problem(req.version, req.resource_name)
        ep: DialledPlugin | None = None
        if problem is None:
            ep = DialledPlugin(
                req.resource_name,
                req.endpoint,
                os.path.join(self.plugin_dir, req.endpoint),
                self._on_update,
                self._on_end,
            )
            self._dialled.append(ep)
            if not self.register_after_connect:
                self._clients[ep.resource] = ep
            try:
                problem = await ep.connect(self.dial_timeout_s)
            except BaseException:
                await ep.close()  # cancelled by stop(): leave no channel behind
                raise
            if problem is None and self._server is None:
                problem = "kubelet is shutting down"
            if problem is not None:
                if not self.register_after_connect:
                    self._clients.pop(ep.resource, None)
                _log.warning("standin_connect_failed", resource=ep.resource, error=problem)
                ep = None
        if ep is not None:
            if self.register_after_connect:
                self._clients[ep.resource] = ep
            await self._replace(ep)
            ep.start_watch()
        self.registrations.append(
            RegistrationRecord(
                at=time.monotonic(),
                resource=req.resource_name,
                endpoint=req.endpoint,
                version=req.version,
                accepted=problem is None,
                error=problem or "",
                options=None if ep is None else ep.options,
            )
        )
        if problem:
            _log.warning("standin_register_rejected", resource=req.resource_name, error=problem)
        else:
            _log.info("standin_registered", resource=req.resource_name, endpoint=req.endpoint)
        await self._notify()
        return problem

    async def _replace(self, ep: DialledPlugin) -> None:
        """Make `ep` the resource's endpoint, as the kubelet's PluginConnected does: an
        older client is neither told nor disconnected, and its stream, if still open,
        runs on (see _on_end). The resource's devices (and their health) stand until a
        list comes: capacity never drops to 0 on a registration."""
        self._endpoints[ep.resource] = ep
        if ep.resource not in self._state.resources:
            self._state.resources.add(ep.resource)
            self._save()

    async def _on_update(self, ep: DialledPlugin) -> None:
        """A list from any client of the resource, current or not, is the resource's."""
        self._devices[ep.resource] = dict(ep.devices)
        since = self._dropped_at.get(ep.resource)
        if since is not None and self._servable(ep.resource):
            del self._dropped_at[ep.resource]
            gap = time.monotonic() - since
            self._unserved[ep.resource] = self._unserved.get(ep.resource, 0.0) + gap
        await self._notify()

    def _servable(self, resource: str) -> bool:
        ep = self._endpoints.get(resource)
        healthy = any(d.healthy for d in self._devices.get(resource, {}).values())
        return ep is not None and not ep.stopped and healthy

    def unserved_s(self, resource: str) -> float:
        """Seconds the resource's allocatable was 0 because its plugin was disconnected
        (a stream ended), until a plugin registered again and sent a healthy list."""
        since = self._dropped_at.get(resource)
        ongoing = 0.0 if since is None else time.monotonic() - since
        return self._unserved.get(resource, 0.0) + ongoing

    async def _on_end(self, ep: DialledPlugin) -> None:
        """A plugin's ListAndWatch stream ended (the stand-in's own stop aside). As
        the kubelet's runClient does, this disconnects the resource's CURRENT client,
        whichever stream ended (none: nothing happens): it is deregistered, its
        connection closed (its stream, if open, is cancelled, and that end comes here
        too), then every device turns Unhealthy (capacity stays, allocatable drops to
        0) and the endpoint then in place is stopped, until a plugin registers again
        and sends a list. So when an old instance's stream ends after a newer one
        registered, the newer one is dropped, and a pod admitted before a plugin
        registers again fails with "no healthy devices present". The ended client's
        own connection is left open, as the kubelet leaves it, until stop()."""
        current = self._clients.pop(ep.resource, None)
        if current is not None:
            at = time.monotonic()
            self.disconnects.append(Disconnect(at, ep.resource, ep.endpoint, current.endpoint))
            if current is not ep:
                self.stale_streams.append(
                    StaleStream(
                        at,
                        ep.resource,
                        ep.endpoint,
                        current.endpoint,
                        "an old stream ended after the resource registered again",
                    )
                )
                _log.warning(
                    "standin_resource_dropped", resource=ep.resource, endpoint=current.endpoint
                )
            await current.hang_up()
            self._plugin_disconnected(ep.resource)
        await self._notify()

    def _plugin_disconnected(self, resource: str) -> None:
        """Every device Unhealthy and the endpoint in place now stopped (PluginDisconnected)."""
        ep = self._endpoints.get(resource)
        if ep is None:
            return
        devices = self._devices.get(resource, {})
        self._devices[resource] = {
            i: dataclasses.replace(d, healthy=False) for i, d in devices.items()
        }
        ep.stopped = True
        self._dropped_at.setdefault(resource, time.monotonic())

    # admission

    async def admit(
        self, pod: str, containers: Mapping[str, Mapping[str, int]]
    ) -> list[AdmittedContainer]:
        """Admit a pod: containers maps container name -> {resource: count}.

        Raises InsufficientResourceError when the pod asks for more than a resource's capacity
        (the scheduler keeps it Pending) and AdmissionError when device admission
        fails (the kubelet fails it with UnexpectedAdmissionError; nothing is kept).
        """
        if pod in self._state.allocations:
            raise StandinError(f"pod {pod} is already admitted")
        totals: Counter[str] = Counter()
        for requests in containers.values():
            totals.update(requests)
        capacity = self.node_status().capacity
        for resource, count in sorted(totals.items()):
            if count > capacity.get(resource, 0):
                raise InsufficientResourceError(pod, resource)
        held = self._state.held()
        admitted: list[AdmittedContainer] = []
        for ctr, requests in containers.items():
            for resource in sorted(r for r, n in requests.items() if n > 0):
                ep = self._endpoints.get(resource)
                taken = held.setdefault(resource, set())
                devices = self.devices(resource).values()
                ids, alloc = await allocate_container(
                    ep, devices, resource, requests[resource], taken
                )
                taken.update(ids)
                admitted.append(AdmittedContainer(pod, ctr, resource, ids, alloc))
        uid = self._state.record(pod, [(a.container, a.resource, a.device_ids) for a in admitted])
        admitted = [dataclasses.replace(a, pod_uid=uid) for a in admitted]
        self._save()
        _log.info("standin_admitted", pod=pod, devices=[a.device_ids for a in admitted])
        await self._notify()
        return admitted

    async def release(self, pod: str) -> None:
        """The pod is gone: its devices are free again."""
        if self._state.forget(pod):
            self._save()
            await self._notify()

    def allocations(self) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
        """pod -> container -> resource -> device IDs, as checkpointed."""
        return {
            pod: {ctr: dict(res) for ctr, res in by_ctr.items()}
            for pod, by_ctr in self._state.allocations.items()
        }

    async def preferred_allocation(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """Send one GetPreferredAllocation container request; AdmissionError on failure."""
        return await self._endpoint_for(resource).preferred_allocation(
            available, must_include, size
        )

    async def allocate(
        self, resource: str, containers: Sequence[Sequence[str]]
    ) -> list[ContainerAllocation]:
        """Send one Allocate with a request per container; AdmissionError on failure."""
        return await self._endpoint_for(resource).allocate(containers)

    # observation

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def wait_for(
        self, predicate: Callable[[KubeletStandin], bool], timeout_s: float = 30.0
    ) -> None:
        """Return once predicate(self) holds, re-checked on every state change. The default
        limit only detects a hang: it is no budget a loaded machine could miss."""
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: predicate(self)), timeout_s)
            except TimeoutError:
                raise TimeoutError(
                    f"kubelet stand-in condition not met within {timeout_s}s; "
                    f"node status: {self.node_status()!r}"
                ) from None

    def pod_uid(self, pod: str) -> str | None:
        """The UID the stand-in gave an admitted pod."""
        return self._state.uids.get(pod)

    def _allocatable(self) -> dict[str, tuple[str, ...]]:
        """resource -> every device ID of its plugin (as the kubelet's allocatable list)."""
        return {name: tuple(sorted(self.devices(name))) for name in self.resources()}

    def resources(self) -> list[str]:
        """Every resource ever registered (the checkpoint remembers them across restarts)."""
        return sorted(self._state.resources)

    def endpoint(self, resource: str) -> str | None:
        """The socket base name serving the resource now, if registered and streaming."""
        ep = self._endpoints.get(resource)
        live = ep is not None and ep.connected and not ep.stopped
        return ep.endpoint if ep is not None and live else None

    def options(self, resource: str) -> PluginOptions | None:
        ep = self._endpoints.get(resource)
        return None if ep is None else ep.options

    def devices(self, resource: str) -> dict[str, DeviceState]:
        """The latest device list of the resource (empty when not registered)."""
        return dict(self._devices.get(resource, {}))

    def updates(self, resource: str) -> int:
        """How many ListAndWatch messages the current endpoint has sent."""
        ep = self._endpoints.get(resource)
        return 0 if ep is None else ep.updates

    def serves(self, expected: Mapping[str, int]) -> bool:
        """Each resource (name -> device count) registered and streaming its full list,
        every device healthy."""
        for name, count in expected.items():
            devices = self.devices(name)
            if self.endpoint(name) is None or len(devices) != count:
                return False
            if not all(d.healthy for d in devices.values()):
                return False
        return True

    def node_status(self) -> NodeStatus:
        status = NodeStatus()
        held = self._state.held()
        for name in self.resources():
            devs = self.devices(name).values()
            taken = held.get(name, set())
            status.capacity[name] = len(devs)
            status.allocatable[name] = sum(d.healthy for d in devs)
            status.allocated[name] = len(taken)
            status.free[name] = sum(d.healthy and d.id not in taken for d in devs)
        return status

    def plugin_stub(self, resource: str) -> pb_grpc.DevicePluginAsyncStub:
        """The raw DevicePlugin client of a registered resource, for wire-level calls."""
        return self._endpoint_for(resource).stub

    def _endpoint_for(self, resource: str) -> DialledPlugin:
        ep = self._endpoints.get(resource)
        if ep is None:
            raise StandinError(f"no plugin registered for {resource}")
        return ep

    def _save(self) -> None:
        checkpoint.save(self.checkpoint_path, self._state)
