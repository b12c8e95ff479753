"""The PodResources client over real gRPC on a unix socket, against the kubelet stand-in
serving what it admitted, and the kubelet's device checkpoint read back for pod UIDs."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubelet_fakes import FakeHandler, make_resource, short_dir

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.podresources import PodResourcesClient, read_checkpoint
from gpuslice.core.errors import BackendError
from gpuslice.core.usage import CheckpointEntry, ContainerDevices
from gpuslice.testing.kubelet import KubeletStandin

SHARED = "nvidia.com/gpu.shared"


@pytest.fixture
def root() -> Iterator[str]:
    yield from short_dir()


@pytest.fixture
async def kubelet(root: str) -> AsyncIterator[KubeletStandin]:
    plugin_dir = os.path.join(root, "device-plugins")
    async with KubeletStandin(plugin_dir, os.path.join(root, "pr", "kubelet.sock")) as standin:
        handler = FakeHandler(make_resource(SHARED, gpus=2, replicas=4))
        srv = DevicePluginServer(handler, plugin_dir)
        await srv.start()
        await srv.register(standin.socket_path)
        await standin.wait_for(lambda k: k.node_status().allocatable.get(SHARED) == 8)
        yield standin
        await srv.stop(0)


@pytest.fixture
async def client(kubelet: KubeletStandin) -> AsyncIterator[PodResourcesClient]:
    assert kubelet.pod_resources_socket is not None
    c = PodResourcesClient(kubelet.pod_resources_socket, kubelet.checkpoint_path)
    yield c
    await c.aclose()


async def test_list_names_each_container_and_the_device_ids_it_was_admitted_with(
    kubelet: KubeletStandin, client: PodResourcesClient
) -> None:
    assert await client.list() == ()
    train = await kubelet.admit("ml/train", {"worker": {SHARED: 2}, "sidecar": {}})
    (note,) = await kubelet.admit("notebook", {"main": {SHARED: 1}})
    listed = await client.list()
    assert set(listed) == {
        ContainerDevices("ml", "train", "worker", SHARED, train[0].device_ids),
        ContainerDevices("default", "notebook", "main", SHARED, note.device_ids),
    }
    await kubelet.release("ml/train")
    assert [c.pod for c in await client.list()] == ["notebook"]


async def test_allocatable_lists_every_replica_of_the_resource(
    kubelet: KubeletStandin, client: PodResourcesClient
) -> None:
    allocatable = await client.allocatable()
    assert sorted(allocatable[SHARED]) == sorted(kubelet.devices(SHARED))
    assert len(allocatable[SHARED]) == 8


async def test_pod_uids_come_from_the_kubelets_device_checkpoint(
    kubelet: KubeletStandin, client: PodResourcesClient
) -> None:
    (admitted,) = await kubelet.admit("ml/train", {"worker": {SHARED: 2}})
    assert client.pod_uids() == (
        CheckpointEntry(admitted.pod_uid, "worker", SHARED, admitted.device_ids),
    )


async def test_an_absent_kubelet_is_a_transient_error_naming_the_socket(root: str) -> None:
    path = os.path.join(root, "nothing.sock")
    c = PodResourcesClient(path, timeout_s=0.5)
    try:
        with pytest.raises(BackendError, match=r"PodResources List on .*nothing\.sock failed"):
            await c.list()
    finally:
        await c.aclose()


@pytest.mark.parametrize(
    ("device_ids", "expected"),
    [
        ({"0": ["GPU-a::1"], "1": ["GPU-b::0"]}, ("GPU-a::1", "GPU-b::0")),  # by NUMA (1.20+)
        (["GPU-a"], ("GPU-a",)),  # before 1.20
    ],
)
def test_both_checkpoint_layouts_are_read(
    tmp_path: Path, device_ids: object, expected: tuple[str, ...]
) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    entry = {"PodUID": "u", "ContainerName": "c", "ResourceName": "r", "DeviceIDs": device_ids}
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": [entry]}, "Checksum": 1}))
    assert read_checkpoint(str(path)) == (CheckpointEntry("u", "c", "r", expected),)


def test_a_missing_checkpoint_gives_no_uids_and_a_bad_one_one_line(tmp_path: Path) -> None:
    """No checkpoint yet (no pod allocated) is no UIDs; one that is not a checkpoint
    fails the sample with a one-line BackendError rather than joining nothing."""
    assert read_checkpoint(str(tmp_path / "missing")) == ()
    (tmp_path / "bad").write_text("{not json")
    with pytest.raises(BackendError, match=r"^kubelet checkpoint .*/bad: not a device checkpoint"):
        read_checkpoint(str(tmp_path / "bad"))
