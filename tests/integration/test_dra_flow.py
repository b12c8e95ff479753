"""The DRA flow on a simulated node, with a pod's claim prepared and unprepared by the
same code the kubelet calls: registration through plugins_registry, ResourceSlices in
the API, NodePrepareResources answered with CDI IDs a runtime resolves, idempotence by
claim UID, refusals that reach the pod, and restarts of the kubelet and of the agent."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from agent_harness import is_socket, remove_dir, short_dir, write_file
from dra_harness import DRIVER, NODE, DraRig, dra_rig
from faults_harness import eventually

from gpuslice.adapters.cdi_file import CdiSpecDir, find_toolkit_devices, is_spec_name
from gpuslice.adapters.fswatch import DirWatcher
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2 as v1
from gpuslice.adapters.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from gpuslice.core.dra.devices import DraOptions
from gpuslice.services.cdi import CdiSpecs

GPU0 = "gpu-0000-07-00-0"  # dgx-a100's first GPU, by PCI bus ID
GPU1 = "gpu-0000-0f-00-0"
TS_CONFIG = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


def gpu_config(**sharing: object) -> dict[str, object]:
    params: dict[str, object] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
    if sharing:
        params["sharing"] = sharing
    return {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gsd-")
    yield path
    remove_dir(path)


@pytest.fixture
async def rig(root: str, tmp_path: Path) -> AsyncIterator[DraRig]:
    async with dra_rig(root, tmp_path) as running:
        yield running


async def test_the_node_publishes_one_pool_of_its_gpus_with_stable_names(rig: DraRig) -> None:
    devices = await rig.published(lambda d: len(d) == 8)
    assert GPU0 in devices
    assert devices[GPU0]["attributes"]["uuid"] == {"string": rig.gpu(0)}
    assert devices[GPU0]["attributes"]["type"] == {"string": "gpu"}
    (only,) = rig.api.dra.node_slices(NODE)
    assert only["spec"]["driver"] == DRIVER
    assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}


async def test_a_pod_claim_is_prepared_resolved_and_unprepared(rig: DraRig) -> None:
    plugin = await rig.kubelet.discover(DRIVER)
    assert plugin.service == "v1.DRAPlugin"
    assert plugin.health
    assert plugin.endpoint == os.path.join(rig.plugin_dir, "dra.sock")
    await rig.published(lambda d: GPU0 in d)
    claim = rig.put_claim("pod-gpu", GPU0)
    _, uid, _ = claim

    result = (await rig.kubelet.prepare(DRIVER, [claim]))[uid]
    assert result.error == ""
    (device,) = result.devices
    assert (device.pool, device.device, device.request_names) == (NODE, GPU0, ("gpu",))
    assert device.cdi_ids == (f"k8s.gpu.nvidia.com/claim={uid}-{GPU0}",)
    edits = rig.kubelet.resolve_cdi(device.cdi_ids)
    assert "/dev/nvidia0" in edits["deviceNodes"]
    assert "/dev/nvidiactl" in edits["deviceNodes"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    assert rig.spec_files() == [f"k8s.gpu.nvidia.com-claim_{uid}.json"]
    assert uid in rig.checkpoint()["claims"]

    # the same claim again (a second pod, a kubelet retry): the same answer, no API read
    reads = len(rig.api.of("GET", "resourceclaims"))
    again = (await rig.kubelet.prepare(DRIVER, [claim]))[uid]
    assert again == result
    assert len(rig.api.of("GET", "resourceclaims")) == reads

    assert await rig.kubelet.unprepare(DRIVER, [claim]) == {uid: ""}
    assert rig.spec_files() == []
    assert await rig.kubelet.unprepare(DRIVER, [claim]) == {uid: ""}  # idempotent


async def test_a_refused_config_reaches_the_pod_as_a_one_line_error(rig: DraRig) -> None:
    await rig.kubelet.discover(DRIVER)
    await rig.published(lambda d: GPU0 in d)
    bad = gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Fast"})
    claim = rig.put_claim("bad", GPU0, config=[bad])
    result = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]]
    assert result.devices == ()
    assert result.error.startswith("claim ml/bad: config FromClaim[0].opaque.parameters.sharing")
    assert "'Fast'; allowed: Default, Short, Medium, Long" in result.error
    assert rig.spec_files() == []
    missing = ("ml", "uid-nope", "nope")
    result = (await rig.kubelet.prepare(DRIVER, [missing]))["uid-nope"]
    assert result.error.startswith("claim ml/nope: cannot read it:")


async def test_a_device_another_claim_holds_is_refused(rig: DraRig) -> None:
    await rig.kubelet.discover(DRIVER)
    await rig.published(lambda d: GPU0 in d)
    first, second = rig.put_claim("a", GPU0), rig.put_claim("b", GPU0)
    assert (await rig.kubelet.prepare(DRIVER, [first]))[first[1]].error == ""
    refused = (await rig.kubelet.prepare(DRIVER, [second]))[second[1]]
    assert refused.error == (
        f"claim ml/b: device {GPU0} is prepared for claim ml/a ({first[1]}) and is not shared"
    )
    await rig.kubelet.unprepare(DRIVER, [first])
    assert (await rig.kubelet.prepare(DRIVER, [second]))[second[1]].error == ""


async def test_two_pods_share_one_time_sliced_gpu_with_a_claim_each(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path, config=TS_CONFIG) as rig:
        await rig.kubelet.discover(DRIVER)
        devices = await rig.published(lambda d: GPU0 in d)
        assert devices[GPU0]["attributes"]["sharing"] == {"string": "time-slicing"}
        a = rig.put_claim("a", GPU0, config=[gpu_config(strategy="TimeSlicing")])
        b = rig.put_claim("b", GPU0)
        results = await rig.kubelet.prepare(DRIVER, [a, b])
        assert [r.error for r in results.values()] == ["", ""]
        assert len(rig.spec_files()) == 2
        for result in results.values():  # two specs of one kind, each resolvable
            assert (
                "/dev/nvidia0" in rig.kubelet.resolve_cdi(result.devices[0].cdi_ids)["deviceNodes"]
            )


async def test_consumable_shares_are_published_on_request(root: str, tmp_path: Path) -> None:
    opts = DraOptions(consumable_shares=True)
    async with dra_rig(root, tmp_path, config=TS_CONFIG, opts=opts) as rig:
        devices = await rig.published(lambda d: GPU0 in d)
        assert devices[GPU0]["allowMultipleAllocations"] is True
        assert devices[GPU0]["capacity"]["shares"]["value"] == "4"
        await rig.kubelet.discover(DRIVER)
        a = rig.put_claim("a", GPU0, shareID="share-a")
        b = rig.put_claim("b", GPU0, shareID="share-b")
        results = await rig.kubelet.prepare(DRIVER, [a, b])
        assert [r.devices[0].share_id for r in results.values()] == ["share-a", "share-b"]


async def test_a_kubelet_restart_that_wipes_the_sockets_finds_them_served_again(
    rig: DraRig,
) -> None:
    await rig.kubelet.discover(DRIVER)
    await rig.published(lambda d: GPU0 in d)
    claim = rig.put_claim("a", GPU0)
    first = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]]
    await rig.kubelet.restart(wipe=True)
    assert not is_socket(os.path.join(rig.registry, f"{DRIVER}-reg.sock"))
    await rig.kubelet.discover(DRIVER)  # waits for the socket to be back
    assert rig.frontend.socket_restarts == 1
    # the restarted kubelet prepares the running pod's claim again: same answer
    assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]] == first
    assert await rig.kubelet.unprepare(DRIVER, [claim]) == {claim[1]: ""}


async def test_an_agent_restart_keeps_prepared_claims_unpreparable(rig: DraRig) -> None:
    await rig.kubelet.discover(DRIVER)
    await rig.published(lambda d: GPU0 in d)
    a, b = rig.put_claim("a", GPU0), rig.put_claim("b", GPU1)
    before = await rig.kubelet.prepare(DRIVER, [a, b])
    await rig.stop()
    rig.api.dra.claims.clear()  # the claims are gone from the API meanwhile
    await rig.start()
    await rig.kubelet.discover(DRIVER)
    # prepared before: answered from the checkpoint, and GPU0 is still held
    assert await rig.kubelet.prepare(DRIVER, [a]) == {a[1]: before[a[1]]}
    c = rig.put_claim("c", GPU0)
    assert "is prepared for claim ml/a" in (await rig.kubelet.prepare(DRIVER, [c]))[c[1]].error
    assert await rig.kubelet.unprepare(DRIVER, [a, b]) == {a[1]: "", b[1]: ""}
    assert rig.spec_files() == []
    # the slices continue the earlier agent's pool generation
    (only,) = rig.api.dra.node_slices(NODE)
    assert only["spec"]["pool"]["generation"] == 2


async def test_the_toolkits_own_cdi_device_is_named_beside_ours(root: str, tmp_path: Path) -> None:
    """Where the NVIDIA Container Toolkit's spec is on the node (it carries the driver's
    libraries), each device's answer names its toolkit device too, by UUID."""
    os.makedirs(os.path.join(root, "cdi"))
    async with dra_rig(root, tmp_path) as bare:
        gpu = bare.gpu(0)
    toolkit = (
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        f"- name: {gpu}\n  containerEdits:\n    env: [NVIDIA_TOOLKIT=yes]\n"
        "containerEdits:\n  mounts:\n  - {hostPath: /usr/lib/libcuda.so.1, "
        "containerPath: /usr/lib/libcuda.so.1}\n"
    )
    write_file(os.path.join(root, "cdi", "nvidia.yaml"), toolkit)
    async with dra_rig(root, tmp_path) as rig:
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: GPU0 in d)
        claim = rig.put_claim("a", GPU0)
        (device,) = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].devices
        assert device.cdi_ids[1] == f"nvidia.com/gpu={gpu}"
        edits = rig.kubelet.resolve_cdi(device.cdi_ids)
        assert "NVIDIA_TOOLKIT=yes" in edits["env"]
        assert {
            "hostPath": "/usr/lib/libcuda.so.1",
            "containerPath": "/usr/lib/libcuda.so.1",
        } in edits["mounts"]
        assert rig.frontend.status().get("cdiToolkit") is None


async def test_a_toolkit_spec_appearing_or_going_is_followed(root: str, tmp_path: Path) -> None:
    """The toolkit's spec written after the agent started (its DaemonSet finishing later)
    is named by the claims prepared next; renamed away, it is no longer named, and the
    status says so: the node's CDI directories are watched, with no reload."""
    cdi = os.path.join(root, "cdi")
    static = os.path.join(root, "etc-cdi")
    os.makedirs(cdi)
    find = lambda: find_toolkit_devices([cdi, static])  # noqa: E731
    node_cdi = CdiSpecs(
        CdiSpecDir(cdi),
        find_toolkit=find,
        toolkit_dirs=(cdi, static),
        watch=lambda path, names: DirWatcher(path, names, poll_interval=0.5, follow=False),
        is_spec=is_spec_name,
    )
    async with dra_rig(root, tmp_path, cdi=node_cdi, find_toolkit=find) as rig:
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: GPU0 in d)
        gpu = rig.gpu(0)
        assert "cdiToolkit" in rig.frontend.status()

        async def named(name: str) -> bool:
            claim = rig.put_claim(name, GPU0)
            prepared = await rig.kubelet.prepare(DRIVER, [claim])
            (device,) = prepared[claim[1]].devices
            await rig.kubelet.unprepare(DRIVER, [claim])
            return f"nvidia.com/gpu={gpu}" in device.cdi_ids

        assert not await named("before")
        toolkit = (
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
            f"- name: {gpu}\n  containerEdits:\n    env: [NVIDIA_TOOLKIT=yes]\n"
        )
        os.makedirs(static)  # /etc/cdi itself may come late
        write_file(os.path.join(static, "nvidia.yaml"), toolkit)
        await eventually(lambda: rig.frontend.driver.toolkit.problem is None, "found", 30)
        assert await named("after")
        assert "cdiToolkit" not in rig.frontend.status()

        os.rename(os.path.join(static, "nvidia.yaml"), os.path.join(static, "nvidia.old"))
        await eventually(lambda: rig.frontend.driver.toolkit.problem is not None, "gone", 30)
        assert not await named("gone")
        assert "cdiToolkit" in rig.frontend.status()


async def test_sockets_another_process_serves_are_waited_for(root: str, tmp_path: Path) -> None:
    """The agent this one replaces (a rolling update) still serves the DRA socket: the new
    one waits, says why in its status, and serves once the old one is gone."""
    service = os.path.join(root, "plugins", DRIVER, "dra.sock")
    old = await _serving_dra(service)
    try:
        async with dra_rig(root, tmp_path, register=False) as rig:
            await asyncio.wait_for(rig.frontend.blocked.wait(), 5)
            assert not rig.frontend.serving.is_set()
            assert "another process serves" in str(rig.frontend.status()["waitingFor"])
            await old.stop(None)
            await asyncio.wait_for(rig.frontend.serving.wait(), 5)
            await rig.kubelet.discover(DRIVER)
            assert "waitingFor" not in rig.frontend.status()
    finally:
        await old.stop(None)


class _OldPlugin(v1_grpc.DRAPluginServicer):
    """Another DRA plugin's service socket: it answers Prepare."""

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: object
    ) -> v1.NodePrepareResourcesResponse:
        return v1.NodePrepareResourcesResponse()


async def _serving_dra(path: str) -> grpc.aio.Server:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    server = grpc.aio.server()
    v1_grpc.add_DRAPluginServicer_to_server(_OldPlugin(), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


async def test_a_time_slicing_interval_is_set_on_the_gpu(rig: DraRig) -> None:
    """As NVIDIA's driver: a GpuConfig's TimeSlicing interval becomes the GPU's
    compute-policy time slice, through the backend (simulated here)."""
    await rig.published(lambda d: GPU0 in d)
    long = gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"})
    claim = rig.put_claim("long", GPU0, config=[long])
    assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
    assert rig.slicer.time_slice(rig.gpu(0)) == "Long"
    assert rig.slicer.time_slice(rig.gpu(1)) is None
