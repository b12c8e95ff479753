"""The stand-in's client side of one registered plugin: options, device stream, calls."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc
import structlog

from gpuslice.adapters.deviceplugin.api import HEALTHY, pb, pb_grpc, unix_target
from gpuslice.adapters.deviceplugin.convert import allocation_from_pb
from gpuslice.core.response import ContainerAllocation
from gpuslice.testing.kubelet.records import AdmissionError, DeviceState, PluginOptions

_log = structlog.get_logger()
_T = TypeVar("_T")
Callback = Callable[["DialledPlugin"], Awaitable[None]]


class DialledPlugin:
    """A dialled plugin socket with its latest ListAndWatch device list."""

    def __init__(
        self, resource: str, endpoint: str, socket_path: str, on_update: Callback, on_end: Callback
    ) -> None:
        self.resource = resource
        self.endpoint = endpoint
        self.socket_path = socket_path
        self.options = PluginOptions()
        self.devices: dict[str, DeviceState] = {}
        self.updates = 0  # ListAndWatch messages received
        self.stream_open = False
        self.stream_ended = asyncio.Event()
        self.connected = False  # registered and its stream has not ended
        self.stopped = False  # the kubelet's endpoint stop time is set: Allocate refused
        self.end_reason = ""
        self.registered_at = time.monotonic()
        self._on_update = on_update
        self._on_end = on_end
        # A connection of its own, as the kubelet dials each client afresh: gRPC would
        # otherwise share one with an older client of the same path (an old instance
        # still serving the kubelet's connection after its successor took the path).
        self._channel = grpc.aio.insecure_channel(
            unix_target(socket_path), options=(("grpc.use_local_subchannel_pool", 1),)
        )
        self.stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(self._channel)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._hung_up = False

    async def connect(self, timeout_s: float) -> str | None:
        """As the kubelet's client.Connect: dial, blocking until the socket accepts
        (`timeout_s` at most: a missing socket holds the caller that long), then ask for
        the plugin's options (PluginConnected). Returns the kubelet's error text, or None."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
        except TimeoutError:
            await self._channel.close()  # no connection was made: none to leave open
            return "failed to dial device plugin: context deadline exceeded"
        try:
            opts = await self.stub.GetDevicePluginOptions(pb.Empty(), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return (
                "failed to get device plugin options: rpc error: "
                f"code = {_go_code(exc.code())} desc = {exc.details()}"
            )
        self.options = PluginOptions(
            opts.pre_start_required, opts.get_preferred_allocation_available
        )
        return None

    def start_watch(self) -> None:
        """Open ListAndWatch and keep the latest device list."""
        self.connected = True
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def hang_up(self) -> None:
        """Close the connection, as the kubelet's Disconnect does: the stream is
        cancelled, and its end is handled as any other (on_end runs)."""
        self._hung_up = True
        self.connected = False
        await self._channel.close()

    async def close(self) -> None:
        """End our side of the stream and the channel, telling no one (the stand-in stops)."""
        self._closing = True
        self.connected = False
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():  # not from _on_end
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._channel.close()

    async def _watch(self) -> None:
        call = self.stub.ListAndWatch(pb.Empty())
        self.stream_open = True
        try:
            async for msg in call:
                self.devices = {d.ID: _device_state(d) for d in msg.devices}
                self.updates += 1
                await self._on_update(self)
            self.end_reason = "stream ended by the plugin"
        except grpc.aio.AioRpcError as exc:
            self.end_reason = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._hung_up or (task is not None and task.cancelling()):
                raise
            self.end_reason = "CANCELLED: the kubelet closed the connection"
        finally:
            self.stream_open = False
            self.stream_ended.set()
        if not self._closing:
            self.connected = False
            _log.info("standin_stream_ended", resource=self.resource, reason=self.end_reason)
            await self._on_end(self)

    async def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include,
                    allocation_size=size,
                )
            ]
        )
        resp = await self._rpc("GetPreferredAllocation", self.stub.GetPreferredAllocation(request))
        return [] if not resp.container_responses else list(resp.container_responses[0].deviceIDs)

    async def allocate(self, containers: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
        )
        resp = await self._rpc("Allocate", self.stub.Allocate(request))
        if len(resp.container_responses) != len(containers):
            raise AdmissionError(
                self.resource,
                f"Allocate for {self.resource} returned {len(resp.container_responses)} "
                f"container responses for {len(containers)} requests",
            )
        return [allocation_from_pb(r) for r in resp.container_responses]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        request = pb.PreStartContainerRequest(devices_ids=device_ids)
        await self._rpc("PreStartContainer", self.stub.PreStartContainer(request))

    async def _rpc(self, method: str, call: Awaitable[_T]) -> _T:
        """Await a plugin call; an RPC error becomes the kubelet's admission failure, as
        does a call cut short by this client being dropped (its channel closed)."""
        try:
            return await call
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not (self._closing or self._hung_up) or (task is not None and task.cancelling()):
                raise  # the caller itself is cancelled
            raise AdmissionError(
                self.resource,
                f"{method} failed due to rpc error: code = Canceled desc = grpc: the client "
                "connection is closing, which is unexpected",
                "CANCELLED",
            ) from None
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            raise AdmissionError(
                self.resource,
                f"{method} failed due to rpc error: code = {code} desc = {exc.details()}, "
                "which is unexpected",
                code,
            ) from None


def _go_code(code: grpc.StatusCode) -> str:
    """A status code as Go's codes.Code prints it ("Unavailable", "DeadlineExceeded")."""
    return "".join(part.capitalize() for part in code.name.split("_"))


def _device_state(dev: pb.Device) -> DeviceState:
    return DeviceState(dev.ID, dev.health == HEALTHY, tuple(n.ID for n in dev.topology.nodes))
