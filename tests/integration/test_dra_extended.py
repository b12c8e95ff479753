"""Unchanged pods served by DRA (KEP-5004): a pod asking `nvidia.com/gpu: 2` on a node
where no device plugin serves that name gets a claim the scheduler makes for it (named
after the pod, annotated as such, one request per container and resource); the node
prepares it as any other claim, and the shared name's claims share a replicated GPU."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, NODE, DraRig, dra_rig

ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
REQUEST = "container-0-request-0"  # the scheduler's name: container 0, its first resource


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gse-")
    yield path
    remove_dir(path)


def extended_claim(rig: DraRig, pod: str, resource: str, *devices: str) -> tuple[str, str, str]:
    name = f"{pod}-extended-resources-x7k2p"
    results = [{"request": REQUEST, "driver": DRIVER, "pool": NODE, "device": d}
               for d in devices]  # fmt: skip
    request = {"name": REQUEST, "exactly": {"deviceClassName": "gpu.nvidia.com",
                                            "allocationMode": "ExactCount",
                                            "count": len(devices)}}  # fmt: skip
    obj = rig.api.dra.put_claim("ml", name, results, annotations={ANNOTATION: "true"},
                                requests=[request])  # fmt: skip
    return ("ml", obj["metadata"]["uid"], name)


async def test_the_schedulers_claim_for_an_unchanged_pod_is_prepared(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        devices = await rig.published(lambda d: len(d) == 8)
        two = sorted(devices)[:2]
        claim = extended_claim(rig, "train", "nvidia.com/gpu", *two)
        result = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]]
        assert result.error == ""
        assert [(d.device, d.request_names) for d in result.devices] == [
            (two[0], (REQUEST,)), (two[1], (REQUEST,))]  # fmt: skip
        edits = rig.kubelet.resolve_cdi([i for d in result.devices for i in d.cdi_ids])
        assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(edits["deviceNodes"])
        assert await rig.kubelet.unprepare(DRIVER, [claim]) == {claim[1]: ""}


async def test_shared_name_claims_share_a_replicated_gpu(root: str, tmp_path: Path) -> None:
    config = ("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
              "    resources:\n      - name: nvidia.com/gpu\n        replicas: 2\n")  # fmt: skip
    async with dra_rig(root, tmp_path, hardware="t4", config=config) as rig:
        devices = await rig.published(lambda d: len(d) == 1)
        (gpu,) = devices
        assert devices[gpu]["attributes"]["sharing"] == {"string": "time-slicing"}
        a = extended_claim(rig, "a", "nvidia.com/gpu.shared", gpu)
        b = extended_claim(rig, "b", "nvidia.com/gpu.shared", gpu)
        results = await rig.kubelet.prepare(DRIVER, [a, b])
        assert [r.error for r in results.values()] == ["", ""]
