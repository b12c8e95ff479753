"""A behavioural PluginHandler for the kubelet adapter tests, and short socket dirs.

FakeHandler serves a core Resource with per-device health it can flip, a
trivial preference (must-include first, then available in order) and an
Allocate that names the physical devices, or a fixed ContainerAllocation.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from gpuslice.core.devices import physical_id, replica_id
from gpuslice.core.errors import InvalidRequest
from gpuslice.core.resources import AdvertisedDevice, Resource
from gpuslice.core.response import ContainerAllocation

UUIDS = (
    "GPU-8a1f3c52-1d4e-4b6a-9c3e-0f2b7d5e6a11",
    "GPU-2b7e9d40-5c3a-4f1e-8d2b-6a9c1e4f7b22",
    "GPU-c4d2a8e6-7f1b-4c9d-a3e5-9b8f2d6c1a33",
)


def short_dir() -> Iterator[str]:
    """A fresh directory under /tmp (unix socket paths stay far below 108 bytes)."""
    path = tempfile.mkdtemp(prefix="gsk-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_resource(
    name: str = "nvidia.com/gpu",
    gpus: int = 2,
    replicas: int = 1,
    numa: Sequence[int | None] = (0, 1, None),
) -> Resource:
    devices: list[AdvertisedDevice] = []
    for i, uuid in enumerate(UUIDS[:gpus]):
        ids = [uuid] if replicas == 1 else [replica_id(uuid, n) for n in range(replicas)]
        devices.extend(
            AdvertisedDevice(
                id=dev_id,
                physical_id=uuid,
                gpu_uuid=uuid,
                index=str(i),
                paths=(f"/dev/nvidia{i}",),
                numa_node=numa[i],
                memory_mib=16384,
                replicas=replicas,
            )
            for dev_id in ids
        )
    return Resource(name=name, devices=tuple(devices))


class FakeHandler:
    """PluginHandler over one Resource; records every call it serves."""

    def __init__(self, resource: Resource, allocation: ContainerAllocation | None = None) -> None:
        self.resource = resource
        self.allocation = allocation
        self.healthy = {d.id: True for d in resource.devices}
        self.fail_next: Exception | None = None
        self.preferred_calls: list[tuple[list[str], list[str], int]] = []
        self.allocate_calls: list[list[str]] = []
        self._generation = 0
        self._changed = asyncio.Event()

    @property
    def resource_name(self) -> str:
        return self.resource.name

    @property
    def generation(self) -> int:
        return self._generation

    def devices(self) -> tuple[tuple[AdvertisedDevice, bool], ...]:
        return tuple((d, self.healthy[d.id]) for d in self.resource.devices)

    def set_healthy(self, device_id: str, healthy: bool) -> None:
        self.healthy[device_id] = healthy
        self._generation += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_changed(self, seen: int) -> int:
        while self._generation == seen:
            await self._changed.wait()
        return self._generation

    def preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        self.preferred_calls.append((list(available), list(must_include), size))
        self._maybe_fail()
        picked = list(dict.fromkeys([*must_include, *reversed(available)]))[:size]
        if len(picked) < size:
            raise InvalidRequest(f"not enough available devices: need {size}, have {len(picked)}")
        return picked

    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        self.allocate_calls.append(list(device_ids))
        self._maybe_fail()
        for dev in device_ids:
            if self.resource.device(dev) is None:
                raise InvalidRequest(f"invalid request: unknown device: {dev}")
        if self.allocation is not None:
            return self.allocation
        visible = ",".join(dict.fromkeys(physical_id(d) for d in device_ids))
        return ContainerAllocation(envs={"NVIDIA_VISIBLE_DEVICES": visible})

    def _maybe_fail(self) -> None:
        exc, self.fail_next = self.fail_next, None
        if exc is not None:
            raise exc


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def exists(path: str) -> bool:
    return os.path.lexists(path)


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)
