"""The node's ResourceSlices stay as the agent means them, as on a real node: published
only once the kubelet confirmed the registration, repaired when a starting kubelet (or
anyone) deletes or edits them, withdrawn when the registration is lost."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, NODE, dra_rig

GPU0 = "gpu-0000-07-00-0"
NAME = f"{NODE}-{DRIVER}-0"


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gss-")
    yield path
    remove_dir(path)


def stored(api: Any) -> dict[str, Any]:
    return dict(api.dra.slices[NAME])


async def test_a_kubelet_restart_deletes_the_slices_and_the_agent_restores_them(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: len(d) == 8)
        generation = stored(rig.api)["spec"]["pool"]["generation"]
        await rig.kubelet.restart()  # as it starts, the kubelet deletes its node's slices
        assert rig.kubelet.slices_deleted == [NAME]
        await rig.published(lambda d: len(d) == 8)  # back, with no change on the node
        assert stored(rig.api)["spec"]["pool"]["generation"] == generation
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: len(d) == 8)
        claim = rig.put_claim("after-restart", GPU0)
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
        assert rig.frontend.status()["sliceRepairs"] >= 1


async def test_a_deleted_or_edited_slice_is_repaired(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: len(d) == 8)
        ours = stored(rig.api)["spec"]
        rig.api.dra.delete_slice(NAME)
        await rig.published(lambda d: len(d) == 8)

        def drop_devices(obj: dict[str, Any]) -> None:
            obj["spec"]["devices"] = obj["spec"]["devices"][:1]

        rig.api.dra.edit_slice(NAME, drop_devices)
        await rig.published(lambda d: len(d) == 8)
        assert stored(rig.api)["spec"] == ours
        assert stored(rig.api)["spec"]["pool"]["generation"] == ours["pool"]["generation"]


async def test_slices_wait_for_the_registration(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path, register=False) as rig:
        await asyncio.wait_for(rig.frontend.withheld.wait(), 5)
        assert rig.api.dra.node_slices(NODE) == []
        assert not rig.api.of("POST", "resourceslices")
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: len(d) == 8)


async def test_a_lost_registration_withdraws_the_slices(root: str, tmp_path: Path) -> None:
    """The registration socket deleted (a wiped plugins_registry): the agent serves it
    again, but until the kubelet registers it again nothing could be prepared, so the
    slices go; they come back with the registration."""
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: len(d) == 8)
        os.unlink(os.path.join(rig.registry, f"{DRIVER}-reg.sock"))
        await rig.api.wait_for(lambda s: not s.dra.node_slices(NODE))
        assert rig.api.of("DELETE", "resourceslices")
        await rig.kubelet.discover(DRIVER)
        await rig.published(lambda d: len(d) == 8)


async def test_mig_devices_are_published_by_default(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path, hardware="a100-40gb-mig-mixed") as rig:
        devices = await rig.published(lambda d: len(d) == 5)
        assert sum(d["attributes"]["type"] == {"string": "mig"} for d in devices.values()) == 4
        mig = next(n for n in sorted(devices) if "-mig-" in n)
        claim = rig.put_claim("mig", mig)
        (device,) = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].devices
        assert any(p.startswith("/dev/nvidia-caps/") for p in
                   rig.kubelet.resolve_cdi(device.cdi_ids)["deviceNodes"])  # fmt: skip


async def test_a_broken_slice_watch_is_opened_again(root: str, tmp_path: Path) -> None:
    """The watch dies mid-stream and the next read of the slices is answered with garbage:
    the agent opens the watch again, re-reads, and still repairs what is deleted later."""
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: len(d) == 8)
        opened = len(rig.api.watches("resourceslices"))
        rig.api.corrupt_next("GET", "resourceslices")
        rig.api.drop_watches()
        await rig.api.wait_for(lambda s: len(s.watches("resourceslices")) > opened)
        await rig.api.wait_for(lambda s: s.open_watches("resourceslices") == 1)
        assert rig.api.answered(200)
        rig.api.dra.delete_slice(NAME)
        await rig.published(lambda d: len(d) == 8)


async def test_publish_and_watch_retries_are_jittered(root: str, tmp_path: Path) -> None:
    """Every node of a cluster retries after an API outage: the waits are spread by up to
    a fifth of the backoff either way, drawn anew each time."""
    async with dra_rig(root, tmp_path) as rig:
        delays = {rig.frontend.retry_delay(3) for _ in range(50)}
    assert len(delays) > 40
    assert all(1.6 <= d <= 2.4 for d in delays)  # the third backoff, 2 s, give or take 20 %
