"""The stand-in's PodResources API (v1): List and GetAllocatableResources answered
from what it really admitted and from the devices its plugins advertise.

A pod admitted as "namespace/name" is listed so; a bare name is in "default".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc

from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2 as pr
from gpuslice.adapters.kubelet._proto.podresources.v1 import api_pb2_grpc as pr_grpc

# pod -> container -> resource -> device IDs
Admitted = Callable[[], Mapping[str, Mapping[str, Mapping[str, tuple[str, ...]]]]]
Allocatable = Callable[[], Mapping[str, tuple[str, ...]]]  # resource -> device IDs


def split_pod(pod: str) -> tuple[str, str]:
    """(namespace, name) of an admitted pod's name."""
    namespace, _, name = pod.rpartition("/")
    return namespace or "default", name


class PodResourcesServicer(pr_grpc.PodResourcesListerServicer):
    def __init__(self, admitted: Admitted, allocatable: Allocatable) -> None:
        self._admitted = admitted
        self._allocatable = allocatable

    async def List(  # noqa: N802
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(
            pod_resources=[_pod(pod, by_ctr) for pod, by_ctr in sorted(self._admitted().items())]
        )

    async def GetAllocatableResources(  # noqa: N802
        self,
        request: pr.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(resource_name=name, device_ids=list(ids))
                for name, ids in sorted(self._allocatable().items())
            ]
        )

    async def Get(  # noqa: N802
        self, request: pr.GetPodResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.GetPodResourcesResponse:
        for pod, by_ctr in self._admitted().items():
            if split_pod(pod) == (request.pod_namespace, request.pod_name):
                return pr.GetPodResourcesResponse(pod_resources=_pod(pod, by_ctr))
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_name} not found in namespace {request.pod_namespace}",
        )
        raise AssertionError("unreachable")


def _pod(pod: str, by_ctr: Mapping[str, Mapping[str, tuple[str, ...]]]) -> pr.PodResources:
    namespace, name = split_pod(pod)
    return pr.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            pr.ContainerResources(
                name=ctr,
                devices=[
                    pr.ContainerDevices(resource_name=res, device_ids=list(ids))
                    for res, ids in sorted(by_res.items())
                ],
            )
            for ctr, by_res in sorted(by_ctr.items())
        ],
    )
