"""--dra-dynamic-mig through the kubelet stand-in and the API server stand-in, on the
simulated a100-40gb-mig-mixed node (GPU 0: MIG on with four instances; GPU 1: MIG off):
the partitions and their counters are published, prepare creates the instance at the
allocated placement and writes its CDI spec, unprepare destroys it, a restart in the
middle of a prepare destroys the instance no completed claim owns, the instances of a GPU
the device-plugin path serves are never touched, and health taints every partition."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, NODE, DraRig, dra_rig

from gpuslice.adapters.dra.claim_specs import ClaimSpecDir
from gpuslice.adapters.kube.dra_api import KubeDraApi
from gpuslice.core.dra.devices import DraOptions
from gpuslice.core.errors import BackendError
from gpuslice.core.mig import GpuInstance
from gpuslice.core.ports import GpuBackend

HARDWARE = "a100-40gb-mig-mixed"
G0, G1 = "gpu-0000-00-04-0", "gpu-0000-00-05-0"
THREE_AT_4 = f"{G0}-mig-3g20gb-9-4"
ONE_AT_5 = f"{G0}-mig-1g5gb-19-5"  # overlaps THREE_AT_4 (memory slices 4..7)
ONE_AT_0 = f"{G0}-mig-1g5gb-19-0"
DYNAMIC = DraOptions(dynamic_mig=True)
UNHEALTHY = 2  # the kubelet's health stream


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gdm-")
    yield path
    remove_dir(path)


async def instances(rig: DraRig, index: int) -> tuple[GpuInstance, ...]:
    """The GPU's instances as the (simulated) driver holds them now."""

    def read(backend: GpuBackend) -> tuple[GpuInstance, ...]:
        control = backend.mig_control()
        assert control is not None
        return control.instances(rig.gpu(index))

    return await rig.health.devices.on_backend(read)


async def test_partitions_and_counters_are_published_and_foreign_instances_swept(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE, opts=DYNAMIC) as rig:
        devices = await rig.published(lambda d: ONE_AT_0 in d)
        assert await instances(rig, 0) == ()  # the four no claim owns are destroyed
        assert G0 not in devices  # Ampere: no whole GPU beside its partitions
        assert "consumesCounters" not in devices[G1]  # MIG off on Ampere: a plain GPU
        three = devices[THREE_AT_4]
        assert three["attributes"]["type"] == {"string": "mig"}
        assert three["attributes"]["parentUUID"] == {"string": rig.gpu(0)}
        ((used,),) = [three["consumesCounters"]]
        assert used["counterSet"] == f"{G0}-counter-set"
        assert {f"memory-slice-{i}" for i in range(4, 8)} <= used["counters"].keys()
        slices = rig.api.dra.node_slices(NODE)
        (counters,) = [s for s in slices if "sharedCounters" in s["spec"]]
        assert "devices" not in counters["spec"]
        assert [c["name"] for c in counters["spec"]["sharedCounters"]] == [f"{G0}-counter-set"]
        assert all(len(s["spec"].get("devices", [])) <= 64 for s in slices)
        assert rig.frontend.status()["dynamicMigGpus"] == [rig.gpu(0)]


async def test_prepare_creates_the_instance_at_its_placement_and_unprepare_destroys_it(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE, opts=DYNAMIC) as rig:
        await rig.published(lambda d: THREE_AT_4 in d)
        claim = rig.put_claim("three", THREE_AT_4)
        uid = claim[1]
        result = (await rig.kubelet.prepare(DRIVER, [claim]))[uid]
        assert result.error == ""
        (made,) = await instances(rig, 0)
        assert (made.profile, made.placement.start, made.placement.size) == ("3g.20gb", 4, 4)
        (device,) = result.devices
        edits = rig.kubelet.resolve_cdi(device.cdi_ids)
        caps = [n for n in edits["deviceNodes"] if n.startswith("/dev/nvidia-caps/")]
        assert "/dev/nvidia0" in edits["deviceNodes"]
        assert len(caps) == 2
        entry = rig.checkpoint()["claims"][uid]
        assert entry["migInstances"] == [
            {"parentUuid": rig.gpu(0), "profile": "3g.20gb", "placementStart": 4}
        ]

        # an overlapping placement (a scheduler that did not count): refused, nothing left
        other = rig.put_claim("overlap", ONE_AT_5)
        refused = (await rig.kubelet.prepare(DRIVER, [other]))[other[1]]
        assert "INSUFFICIENT_RESOURCES" in refused.error
        assert other[1] not in rig.checkpoint()["claims"]
        assert rig.spec_files() == [f"k8s.gpu.nvidia.com-claim_{uid}.json"]
        assert [i.placement.start for i in await instances(rig, 0)] == [4]

        assert await rig.kubelet.unprepare(DRIVER, [claim]) == {uid: ""}
        assert await instances(rig, 0) == ()
        assert rig.spec_files() == []
        assert await rig.kubelet.unprepare(DRIVER, [claim]) == {uid: ""}  # idempotent


async def test_on_hopper_a_partition_turns_mig_on_and_the_whole_gpu_turns_it_off(
    root: str, tmp_path: Path
) -> None:
    h0 = "gpu-0000-1b-00-0"
    async with dra_rig(root, tmp_path, hardware="dgx-h100", opts=DYNAMIC) as rig:
        devices = await rig.published(lambda d: f"{h0}-mig-7g80gb-0-0" in d)
        assert devices[h0]["consumesCounters"]  # the whole GPU, beside its partitions

        async def mode() -> bool:
            return await rig.health.devices.on_backend(
                lambda b: b.mig_control().mig_mode(rig.gpu(0))[0]  # type: ignore[union-attr]
            )

        assert not await mode()
        part = rig.put_claim("part", f"{h0}-mig-2g20gb-14-2")
        assert (await rig.kubelet.prepare(DRIVER, [part]))[part[1]].error == ""
        assert await mode()
        assert [i.profile for i in await instances(rig, 0)] == ["2g.20gb"]
        assert await rig.kubelet.unprepare(DRIVER, [part]) == {part[1]: ""}
        whole = rig.put_claim("whole", h0)
        result = (await rig.kubelet.prepare(DRIVER, [whole]))[whole[1]]
        assert result.error == ""
        assert not await mode()
        assert "/dev/nvidia0" in rig.kubelet.resolve_cdi(result.devices[0].cdi_ids)["deviceNodes"]


class StuckSpecs(ClaimSpecDir):
    """A spec directory whose writes never finish once `stuck` (an agent stopped between
    creating the instance and writing the claim's spec)."""

    stuck = False
    reached = asyncio.Event()

    async def write(self, name: str, text: str) -> None:
        if StuckSpecs.stuck:
            StuckSpecs.reached.set()
            await asyncio.Event().wait()
        await super().write(name, text)


async def test_a_restart_mid_prepare_destroys_the_instance_no_completed_claim_owns(
    root: str, tmp_path: Path
) -> None:
    StuckSpecs.stuck, StuckSpecs.reached = False, asyncio.Event()
    async with dra_rig(root, tmp_path, hardware=HARDWARE, opts=DYNAMIC) as rig:
        await rig.stop()
        rig.specs = StuckSpecs
        await rig.start()
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: ONE_AT_0 in d)
        done = rig.put_claim("done", ONE_AT_0)
        assert (await rig.kubelet.prepare(DRIVER, [done]))[done[1]].error == ""
        StuckSpecs.stuck = True
        cut = rig.put_claim("cut", THREE_AT_4)
        call = asyncio.create_task(rig.kubelet.prepare(DRIVER, [cut]))
        await StuckSpecs.reached.wait()
        assert sorted(i.placement.start for i in await instances(rig, 0)) == [0, 4]
        assert rig.checkpoint()["claims"][cut[1]]["state"] == "PrepareStarted"

        await rig.stop()  # the agent is gone mid-prepare; the GPU keeps its instances
        call.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await call
        rig.specs = ClaimSpecDir
        await rig.start()
        await rig.kubelet.discover(DRIVER)
        await rig.frontend.driver.settled.wait()
        assert [i.placement.start for i in await instances(rig, 0)] == [0]  # only `done`'s
        assert set(rig.checkpoint()["claims"]) == {done[1]}
        again = (await rig.kubelet.prepare(DRIVER, [cut]))[cut[1]]  # the kubelet's retry
        assert again.error == ""
        assert sorted(i.placement.start for i in await instances(rig, 0)) == [0, 4]


async def test_a_checkpoint_rebuilt_from_the_api_server_names_the_instance_as_it_is(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE, opts=DYNAMIC) as rig:
        await rig.published(lambda d: THREE_AT_4 in d)
        claim = rig.put_claim("three", THREE_AT_4)
        (device,) = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].devices
        before = rig.kubelet.resolve_cdi(device.cdi_ids)["deviceNodes"]
        await rig.stop()
        await asyncio.to_thread(Path(rig.plugin_dir, "checkpoint.json").write_bytes, b"bad")
        await rig.start()
        await rig.kubelet.discover(DRIVER)
        await rig.frontend.driver.settled.wait()
        assert claim[1] in rig.checkpoint()["claims"]
        assert rig.kubelet.resolve_cdi(device.cdi_ids)["deviceNodes"] == before
        assert [i.placement.start for i in await instances(rig, 0)] == [4]


async def test_instances_of_a_gpu_the_device_plugin_serves_are_never_touched(
    root: str, tmp_path: Path
) -> None:
    kept = ("nvidia.com/mig-1g.5gb",)  # GPU 0's 1g.5gb devices stay on the device plugin
    async with dra_rig(
        root, tmp_path, hardware=HARDWARE, opts=DYNAMIC, device_plugin=kept,
        flags={"mig-strategy": "mixed"},
    ) as rig:  # fmt: skip
        devices = await rig.published(lambda d: G1 in d)
        await rig.frontend.driver.settled.wait()
        assert len(await instances(rig, 0)) == 4
        assert not any(name.startswith(f"{G0}-mig-") and name.count("-") > 8 for name in devices)
        assert rig.frontend.status()["dynamicMigGpus"] == []
        assert all("sharedCounters" not in s["spec"] for s in rig.api.dra.node_slices(NODE))


async def test_no_partition_is_offered_whose_instance_the_device_plugin_would_serve(
    root: str, tmp_path: Path
) -> None:
    """Under mixed, nvidia.com/mig-1g.10gb kept on the device plugin (no such device yet):
    a 1g.10gb instance DRA made would be advertised there too, so none is offered."""
    h0, kept = "gpu-0000-1b-00-0", ("nvidia.com/mig-1g.10gb",)
    async with dra_rig(
        root, tmp_path, hardware="dgx-h100", opts=DYNAMIC, device_plugin=kept,
        flags={"mig-strategy": "mixed"},
    ) as rig:  # fmt: skip
        devices = await rig.published(lambda d: f"{h0}-mig-2g20gb-14-0" in d)
        assert not [name for name in devices if "-mig-1g10gb-" in name]
        assert [name for name in devices if "-mig-1g20gb-" in name]
        assert rig.gpu(0) in rig.frontend.status()["dynamicMigGpus"]


async def test_an_unhealthy_gpu_taints_each_of_its_partitions(root: str, tmp_path: Path) -> None:
    opts = DraOptions(dynamic_mig=True, taint_unhealthy=True)
    async with dra_rig(root, tmp_path, hardware=HARDWARE, opts=opts) as rig:
        await rig.published(lambda d: ONE_AT_0 in d)
        await rig.health.mark(rig.gpu(0))
        devices = await rig.published(lambda d: "taints" in d.get(ONE_AT_0, {}))
        parts = [d for name, d in devices.items() if name.startswith(f"{G0}-mig-")]
        assert len(parts) > 20
        assert all(d.get("taints") for d in parts)
        assert not devices[G1].get("taints")
        health = await rig.kubelet.wait_health(
            DRIVER, lambda h: h.get((NODE, ONE_AT_0), (0, ""))[0] == UNHEALTHY
        )
        sick = {name for (_, name), (state, _) in health.items() if state == UNHEALTHY}
        assert sick == {name for name in devices if name.startswith(f"{G0}-")}
        claim = rig.put_claim("sick", ONE_AT_0)
        refused = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]]
        assert "unhealthy" in refused.error
        assert await instances(rig, 0) == ()


def bad_slice(spec: dict[str, Any]) -> dict[str, object]:
    pool = {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "bad"},
            "spec": {"driver": DRIVER, "nodeName": NODE, "pool": pool, **spec}}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"sharedCounters": [{"name": f"c{i}", "counters": {"a": {"value": "1"}}}
                             for i in range(9)]}, "at most 8 items"),
        ({"sharedCounters": [{"name": "c", "counters": {"a": {"value": "1"}}}],
          "devices": [{"name": "d"}]}, "only one of devices and sharedCounters"),
        ({"devices": [{"name": f"d{i}", "consumesCounters": [
            {"counterSet": "c", "counters": {"a": {"value": "1"}}}]} for i in range(65)]},
         "at most 64 items"),
    ],
)  # fmt: skip
async def test_the_api_stand_in_refuses_slices_past_the_partitionable_limits(
    root: str, tmp_path: Path, spec: dict[str, Any], message: str
) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE) as rig:
        assert rig.client is not None
        with pytest.raises(BackendError, match=message):
            await KubeDraApi(rig.client).put_slice(bad_slice(spec), None)
