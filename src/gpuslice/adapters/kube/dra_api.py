"""KubeDraApi: the DraApi port over the real Kubernetes API (through lightkube): this
node's ResourceSlices and the ResourceClaims the kubelet asks to prepare.

lightkube is imported when an instance is built, as for KubeNodeApi.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog

from gpuslice.core.dra.claims import allocated_here
from gpuslice.core.dra.slices import SliceChange
from gpuslice.core.errors import BackendError

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from gpuslice.adapters.kube.session import ApiSession

LIST_PAGE = 500
MAX_LISTED = 200_000
LIST_TIMEOUT_S = 120.0
MAX_MESSAGE = 1024  # an Event's message, as the API server keeps it
_log = structlog.get_logger()


class KubeDraApi:
    def __init__(self, client: AsyncClient | None = None, *, kubeconfig: str | None = None) -> None:
        from gpuslice.adapters.kube.session import ApiSession, make_client

        self._owns_client = client is None
        self._session: ApiSession = ApiSession(
            client if client is not None else make_client(kubeconfig)
        )

    async def get_claim(self, namespace: str, name: str) -> dict[str, object]:
        return await self._session.get_claim(namespace, name)

    async def claims_on(self, node: str, driver: str) -> list[dict[str, object]]:
        """Only after a bad checkpoint: the claims are listed cluster-wide (no field
        selector reaches an allocation), LIST_PAGE at a time, at most MAX_LISTED of them
        within LIST_TIMEOUT_S; only those allocated here are kept."""
        out: list[dict[str, object]] = []
        try:
            async with asyncio.timeout(LIST_TIMEOUT_S):
                listed = 0
                async for obj in self._session.list_claims(LIST_PAGE):
                    listed += 1
                    if listed > MAX_LISTED:
                        raise BackendError(f"list ResourceClaims: more than {MAX_LISTED}")
                    if allocated_here(obj, driver, node) is not None:
                        out.append(obj)
        except TimeoutError:
            raise BackendError(
                f"list ResourceClaims: not done within {LIST_TIMEOUT_S:g} s", transient=True
            ) from None
        return out

    async def node_event(self, node: str, reason: str, message: str) -> None:
        from gpuslice.adapters.kube import objects

        kind = objects.event_type(warning=True)
        try:
            await self._session.create_event(
                objects.NODE_EVENT_NAMESPACE, node, None, reason, message[:MAX_MESSAGE], kind
            )
        except Exception as exc:  # best effort by contract: an Event must never stop the agent
            _log.warning("node_event_failed", node=node, reason=reason, error=str(exc))

    async def list_slices(self, node: str, driver: str) -> list[dict[str, object]]:
        return list(await self._session.list_slices(node, driver))

    async def put_slice(
        self, body: dict[str, object], current: dict[str, object] | None
    ) -> dict[str, object]:
        if current is None:
            return await self._session.create_slice(dict(body))
        replacement: dict[str, Any] = copy.deepcopy(body)
        meta = current.get("metadata")
        if isinstance(meta, dict) and meta.get("resourceVersion"):
            replacement["metadata"]["resourceVersion"] = meta["resourceVersion"]
        return await self._session.replace_slice(replacement)

    async def delete_slice(self, name: str) -> None:
        from gpuslice.adapters.kube.session import NotFound

        with contextlib.suppress(NotFound):
            await self._session.delete_slice(name)

    async def watch_slices(self, node: str, driver: str) -> AsyncIterator[SliceChange]:
        from gpuslice.adapters.kube.watch import WatchBroken, WatchGone

        try:
            async for event in self._session.watch_slices(node, driver):
                yield SliceChange(event.type, event.value, event.resource_version)
        except (WatchGone, WatchBroken) as exc:
            raise BackendError(str(exc), transient=True) from None

    async def aclose(self) -> None:
        if self._owns_client:
            await self._session.aclose()
