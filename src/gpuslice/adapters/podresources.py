"""The kubelet's PodResources API (v1) client, and its device checkpoint.

List and GetAllocatableResources over the kubelet's unix socket give which
namespace/pod/container holds which device IDs of which resource. The API has no
pod UID; the kubelet's device checkpoint (kubelet_internal_checkpoint in the
device-plugin directory, which the agent mounts anyway) has it, per container,
resource and device IDs, so the two join on those.
"""

from __future__ import annotations

import json
import os

import grpc

from gpuslice.adapters.deviceplugin.api import DEVICE_PLUGIN_DIR, unix_target
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2 as pr
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2_grpc as pr_grpc
from gpuslice.core.errors import BackendError
from gpuslice.core.usage import CheckpointEntry, ContainerDevices

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
CHECKPOINT = os.path.join(DEVICE_PLUGIN_DIR, "kubelet_internal_checkpoint")


class PodResourcesClient:
    """The PodResources port over `socket_path`; call aclose() when done."""

    def __init__(
        self,
        socket_path: str = POD_RESOURCES_SOCKET,
        checkpoint_path: str = CHECKPOINT,
        *,
        timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = socket_path
        self.checkpoint_path = checkpoint_path
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: pr_grpc.PodResourcesListerAsyncStub | None = None

    def _lister(self) -> pr_grpc.PodResourcesListerAsyncStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(unix_target(self.socket_path))
            self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def list(self) -> tuple[ContainerDevices, ...]:
        try:
            reply = await self._lister().List(pr.ListPodResourcesRequest(), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._error("List", exc) from None
        return tuple(
            ContainerDevices(
                pod.namespace, pod.name, ctr.name, dev.resource_name, tuple(dev.device_ids)
            )
            for pod in reply.pod_resources
            for ctr in pod.containers
            for dev in ctr.devices
        )

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        try:
            reply = await self._lister().GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=self._timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error("GetAllocatableResources", exc) from None
        out: dict[str, list[str]] = {}
        for dev in reply.devices:
            out.setdefault(dev.resource_name, []).extend(dev.device_ids)
        return {name: tuple(ids) for name, ids in out.items()}

    def pod_uids(self) -> tuple[CheckpointEntry, ...]:
        return read_checkpoint(self.checkpoint_path)

    async def aclose(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    def _error(self, call: str, exc: grpc.aio.AioRpcError) -> BackendError:
        return BackendError(
            f"PodResources {call} on {self.socket_path} failed: {exc.code().name}: {exc.details()}",
            transient=True,
        )


def read_checkpoint(path: str) -> tuple[CheckpointEntry, ...]:
    """The kubelet's device checkpoint entries; () when it cannot be read. DeviceIDs is
    a map NUMA node -> IDs since Kubernetes 1.20, a plain list before."""
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh)["Data"]["PodDeviceEntries"] or []
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    out = []
    for e in entries:
        try:
            ids = e["DeviceIDs"]
            flat = ids if isinstance(ids, list) else [i for part in ids.values() for i in part]
            out.append(
                CheckpointEntry(
                    str(e["PodUID"]),
                    str(e["ContainerName"]),
                    str(e["ResourceName"]),
                    tuple(str(i) for i in flat),
                )
            )
        except (KeyError, TypeError, AttributeError):
            continue
    return tuple(out)
