"""The DevicePlugin gRPC service for one resource, over a core PluginHandler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
import structlog

from gpuslice.adapters.deviceplugin.api import pb, pb_grpc
from gpuslice.adapters.deviceplugin.convert import allocation_to_pb, device_list
from gpuslice.core.errors import InvalidRequest
from gpuslice.core.metrics import ERROR, INVALID, NO_METRICS, OK
from gpuslice.core.ports import Metrics, PluginHandler

_log = structlog.get_logger()
_T = TypeVar("_T")
_R = TypeVar("_R")
_Ctx = grpc.aio.ServicerContext[Any, Any]
_OPTIONS = pb.DevicePluginOptions(get_preferred_allocation_available=True)
# Status details travel in a trailer, which clients cap (gRPC: 8 KiB soft, 16 KiB hard);
# a longer one, say an absurd device ID quoted back, would arrive as a transport error.
MAX_DETAIL_CHARS = 512
# The kubelet sends one container per call; a request listing more is refused before any
# work (gRPC's 4 MiB receive limit bounds the bytes, this bounds the calls into the core).
MAX_CONTAINER_REQUESTS = 64


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text`, cut in the middle to about `limit` characters when longer, saying so."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 4) :]
    return f"{head}...[{len(text) - len(head) - len(tail)} characters cut]...{tail}"


def _bounded(requests: Sequence[_R]) -> Sequence[_R]:
    if len(requests) > MAX_CONTAINER_REQUESTS:
        raise InvalidRequest(
            f"{len(requests)} container requests in one call; at most {MAX_CONTAINER_REQUESTS}"
        )
    return requests


class HandlerServicer(pb_grpc.DevicePluginServicer):
    """Translates protobuf to PluginHandler calls; the handler owns every decision.

    InvalidRequest becomes INVALID_ARGUMENT with its message; any other exception
    is logged with its stack and becomes INTERNAL, and the server keeps serving.
    """

    def __init__(
        self,
        handler: PluginHandler,
        metrics: Metrics = NO_METRICS,
        on_dropped: Callable[[], None] | None = None,
    ) -> None:
        self._handler = handler
        self._metrics = metrics
        self._resource = handler.resource_name
        self._stopping = asyncio.Event()
        # Told when the kubelet cancels a ListAndWatch stream we did not end: it dropped
        # the resource (see the kubelet reference), which a new Register call restores.
        self._on_dropped = on_dropped
        self._answered = asyncio.Event()  # set at each answered call

    def stop_streams(self) -> None:
        """End every ListAndWatch stream (each returns after its current send)."""
        self._stopping.set()

    async def quiet(self, gap_s: float, limit_s: float) -> None:
        """Return once no call has been answered for `gap_s` (the kubelet admits a pod
        with calls in a row: GetPreferredAllocation, then Allocate), `limit_s` at most."""
        deadline = time.monotonic() + limit_s
        while (left := deadline - time.monotonic()) > 0:
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), min(gap_s, left))
            if not self._answered.is_set():
                return

    async def GetDevicePluginOptions(  # noqa: N802
        self, request: pb.Empty, context: _Ctx
    ) -> pb.DevicePluginOptions:
        return _OPTIONS

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: _Ctx
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        handler = self._handler
        seen = handler.generation
        _log.info("list_and_watch_opened", resource=self._resource, generation=seen)
        try:
            yield device_list(handler.devices())
            while await self._changed(seen):
                seen = handler.generation
                yield device_list(handler.devices())
                _log.info("list_and_watch_sent", resource=self._resource, generation=seen)
        except asyncio.CancelledError:
            if not self._stopping.is_set() and self._on_dropped is not None:
                _log.warning("list_and_watch_cancelled_by_kubelet", resource=self._resource)
                self._on_dropped()
            raise
        except Exception:
            _log.exception("list_and_watch_failed", resource=self._resource)
            raise
        finally:
            _log.info("list_and_watch_closed", resource=self._resource)

    async def _changed(self, seen: int) -> bool:
        """Wait for the next generation; False once the server is stopping."""
        if self._stopping.is_set():
            return False
        changed = asyncio.ensure_future(self._handler.wait_changed(seen))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((changed, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (changed, stopping):
                task.cancel()
            await asyncio.gather(changed, stopping, return_exceptions=True)
        return not self._stopping.is_set()

    async def GetPreferredAllocation(  # noqa: N802
        self,
        request: pb.PreferredAllocationRequest,
        context: _Ctx,
    ) -> pb.PreferredAllocationResponse:
        prefer = self._handler.preferred_allocation
        return await self._call(
            "GetPreferredAllocation",
            context,
            lambda: pb.PreferredAllocationResponse(
                container_responses=[
                    pb.ContainerPreferredAllocationResponse(
                        deviceIDs=prefer(
                            list(req.available_deviceIDs),
                            list(req.must_include_deviceIDs),
                            req.allocation_size,
                        )
                    )
                    for req in _bounded(request.container_requests)
                ]
            ),
        )

    async def Allocate(  # noqa: N802
        self,
        request: pb.AllocateRequest,
        context: _Ctx,
    ) -> pb.AllocateResponse:
        allocate = self._handler.allocate
        return await self._call(
            "Allocate",
            context,
            lambda: pb.AllocateResponse(
                container_responses=[
                    allocation_to_pb(allocate(list(req.devices_ids)))
                    for req in _bounded(request.container_requests)
                ]
            ),
        )

    async def PreStartContainer(  # noqa: N802
        self,
        request: pb.PreStartContainerRequest,
        context: _Ctx,
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    async def _call(self, method: str, context: _Ctx, work: Callable[[], _T]) -> _T:
        started = time.perf_counter()
        try:
            answer = work()
        except InvalidRequest as exc:
            self._observe(method, started, INVALID)
            message = clip(str(exc))
            _log.warning("request_rejected", resource=self._resource, method=method, error=message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        except Exception as exc:
            self._observe(method, started, ERROR)
            _log.exception("request_failed", resource=self._resource, method=method)
            message = f"{method} for {self._resource} failed: {type(exc).__name__}: {exc}"
            await context.abort(grpc.StatusCode.INTERNAL, clip(message, 300))
        self._observe(method, started, OK)
        return answer

    def _observe(self, method: str, started: float, outcome: str) -> None:
        self._answered.set()
        seconds = time.perf_counter() - started
        self._metrics.request_observed(self._resource, method, seconds, outcome)
