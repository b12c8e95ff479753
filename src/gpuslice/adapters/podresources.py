"""The kubelet's PodResources API (v1) client, and its device checkpoint.

List and GetAllocatableResources over the kubelet's unix socket give which
namespace/pod/container holds which device IDs of which resource. The API has no
pod UID; the kubelet's device checkpoint (kubelet_internal_checkpoint in the
device-plugin directory, which the agent mounts anyway) has it, per container,
resource and device IDs, so the two join on those.

Nothing of the kubelet's is touched while no kubelet is there: with `kubelet_socket`
given, the API is dialled and the checkpoint read only while that registration socket
exists (never with "": the agent does not register then). A call before fails at once
with one transient BackendError, as an absent kubelet's would, and the checkpoint reads
as empty.
"""

from __future__ import annotations

import json
import os

import grpc

from gpuslice.adapters.deviceplugin.api import DEVICE_PLUGIN_DIR, unix_target
from gpuslice.adapters.fswatch import file_id
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2 as pr
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2_grpc as pr_grpc
from gpuslice.adapters.outside_files import read_bytes, reason
from gpuslice.core.errors import BackendError
from gpuslice.core.usage import CheckpointEntry, ContainerDevices

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
CHECKPOINT = os.path.join(DEVICE_PLUGIN_DIR, "kubelet_internal_checkpoint")
# About 300 bytes per allocated container: far above what a node's pods need.
CHECKPOINT_MAX_BYTES = 16 << 20


class PodResourcesClient:
    """The PodResources port over `socket_path`; call aclose() when done."""

    def __init__(
        self,
        socket_path: str = POD_RESOURCES_SOCKET,
        checkpoint_path: str = CHECKPOINT,
        *,
        timeout_s: float = 5.0,
        kubelet_socket: str | None = None,  # None: dial whenever asked
    ) -> None:
        self.socket_path = socket_path
        self.checkpoint_path = checkpoint_path
        self._timeout_s = timeout_s
        self._kubelet_socket = kubelet_socket
        self._channel: grpc.aio.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerAsyncStub | None = None

    def _lister(self) -> pr_grpc.PodResourcesListerAsyncStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(unix_target(self.socket_path))
            self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def _no_kubelet(self) -> str | None:
        """Why the kubelet is not to be touched now; None while it is there."""
        kubelet = self._kubelet_socket
        if kubelet is None or (kubelet and file_id(kubelet) is not None):
            return None
        return f"no kubelet at {kubelet} yet" if kubelet else "not registering with a kubelet"

    async def _kubelet_there(self, call: str) -> None:
        """Raise BackendError (closing a channel opened before) while no kubelet is there."""
        why = self._no_kubelet()
        if why is not None:
            await self.aclose()
            raise BackendError(f"PodResources {call} not called: {why}", transient=True)

    async def list(self) -> tuple[ContainerDevices, ...]:
        await self._kubelet_there("List")
        try:
            reply = await self._lister().List(pr.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._error("List", exc) from None
        _check_decoded(reply, pr.ListPodResourcesResponse, "List", self.socket_path)
        return tuple(
            ContainerDevices(
                pod.namespace, pod.name, ctr.name, dev.resource_name, tuple(dev.device_ids)
            )
            for pod in reply.pod_resources
            for ctr in pod.containers
            for dev in ctr.devices
        )

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        await self._kubelet_there("GetAllocatableResources")
        try:
            reply = await self._lister().GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=self._timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error("GetAllocatableResources", exc) from None
        _check_decoded(
            reply, pr.AllocatableResourcesResponse, "GetAllocatableResources", self.socket_path
        )
        out: dict[str, list[str]] = {}
        for dev in reply.devices:
            out.setdefault(dev.resource_name, []).extend(dev.device_ids)
        return {name: tuple(ids) for name, ids in out.items()}

    def pod_uids(self) -> tuple[CheckpointEntry, ...]:
        return () if self._no_kubelet() else read_checkpoint(self.checkpoint_path)

    async def aclose(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    def _error(self, call: str, exc: grpc.aio.AioRpcError) -> BackendError:
        return BackendError(
            f"PodResources {call} on {self.socket_path} failed: {exc.code().name}: {exc.details()}",
            transient=True,
        )


def _check_decoded(reply: object, kind: type, call: str, socket_path: str) -> None:
    """grpc.aio answers None for a reply that does not decode: a one-line BackendError
    then, as for a failed call (the sampler and the holds both catch it)."""
    if not isinstance(reply, kind):
        raise BackendError(
            f"PodResources {call} on {socket_path} failed: the answer is not a "
            f"{kind.__name__} message",
            transient=True,
        )


def read_checkpoint(path: str) -> tuple[CheckpointEntry, ...]:
    """The kubelet's device checkpoint entries; () while there is none. DeviceIDs is a
    map NUMA node -> IDs since Kubernetes 1.20, a plain list before; an entry of other
    shapes is skipped. Raises BackendError (transient, one line) when the file cannot be
    read as a checkpoint: not a regular file, larger than CHECKPOINT_MAX_BYTES, not JSON,
    nested too deeply, or of the wrong shape."""
    try:
        data = read_bytes(path, limit=CHECKPOINT_MAX_BYTES)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise BackendError(f"kubelet checkpoint {path}: {reason(exc)}", transient=True) from None
    try:
        entries = json.loads(data)["Data"]["PodDeviceEntries"] or []
        if not isinstance(entries, list):
            raise TypeError("PodDeviceEntries is not a list")
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        why = f"not a device checkpoint ({type(exc).__name__})"
        raise BackendError(f"kubelet checkpoint {path}: {why}", transient=True) from None
    return tuple(e for e in map(_entry, entries) if e is not None)


def _entry(e: object) -> CheckpointEntry | None:
    if not isinstance(e, dict):
        return None
    ids = e.get("DeviceIDs")
    if isinstance(ids, dict):
        parts = list(ids.values())
        ids = [i for part in parts for i in part] if all(isinstance(p, list) for p in parts) else 0
    fields = (e.get("PodUID"), e.get("ContainerName"), e.get("ResourceName"))
    if not isinstance(ids, list) or not all(isinstance(f, str) for f in fields):
        return None
    if not all(isinstance(i, str) for i in ids):
        return None
    uid, container, resource = fields
    return CheckpointEntry(str(uid), str(container), str(resource), tuple(ids))
