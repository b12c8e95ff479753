"""MPS inside a MIG device through DRA: a MigDeviceConfig asking for MPS gets a control
daemon of its own (the simulated nvidia-cuda-mps-control, as real processes) bound to the
MIG device's UUID with the claim's limits, its pipe directory in the claim's CDI spec, a
client reaching it through the spec's mount; unprepare quits it before the instance is
destroyed; a restarted front-end adopts or restarts the completed claims' daemons and quits
the others; a GPU's failure still taints its partitions; a bad mpsConfig starts nothing.
Against the kubelet and API server stand-ins, on the simulated a100-40gb-mig-mixed node."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import remove_dir, short_dir
from dra_harness import DRIVER, NODE, DraRig, dra_rig
from mps_harness import daemon_pid, kill_daemons, query, runs
from test_dra_checkpoint_rebuild import restart_with, torn
from test_dra_dynamic_mig import HARDWARE, THREE_AT_4, instances

from gpuslice.adapters.hosts.simulated import SIMULATED_MPS_CONTROL
from gpuslice.adapters.mps import LocalLauncher
from gpuslice.adapters.mps.local import gone
from gpuslice.core.dra.devices import DraOptions
from gpuslice.core.mps import DaemonPlan
from gpuslice.frontends.dra.claim_mps import HOLDER
from gpuslice.testing.mps_client import SimulatedClient

MIG_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}
UNHEALTHY = 2  # the kubelet's health stream


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gmm-")
    yield path
    kill_daemons(Path(path, "mps"))  # daemons outlive front-ends: killed once the test ends
    remove_dir(path)


def mps(**mps_config: Any) -> list[dict[str, Any]]:
    params = {**MIG_CONFIG, "sharing": {"strategy": "MPS", "mpsConfig": mps_config}}
    return [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]


async def serving(rig: DraRig, pipe: Path) -> int:
    """The pid of the daemon in `pipe` once it serves: its device no longer held."""
    devices = rig.health.devices
    while (pid := daemon_pid(pipe)) is None or devices.held.get(HOLDER):
        await devices.wait_changed(devices.generation)
    return pid


def pipe(root: str, uid: str) -> Path:
    return Path(root, "mps", "dra-claims", uid, "pipe")


def present(*path: str) -> bool:
    return os.path.exists(os.path.join(*path))


def visible_devices(pid: int) -> str:
    """CUDA_VISIBLE_DEVICES of a running process, as /proc shows its environment."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in env if b"=" in e)["CUDA_VISIBLE_DEVICES"]


async def test_a_static_mig_device_gets_its_own_daemon_with_the_claims_limits(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE) as rig:
        devices = await rig.published(lambda d: any("-mig-1g5gb-" in n for n in d))
        name = next(n for n in sorted(devices) if "-mig-1g5gb-" in n)
        mig_uuid = devices[name]["attributes"]["uuid"]["string"]
        config = mps(defaultActiveThreadPercentage=40, defaultPinnedDeviceMemoryLimit="2Gi")
        claim = rig.put_claim("mps", name, config=config)
        uid = claim[1]
        result = (await rig.kubelet.prepare(DRIVER, [claim]))[uid]
        assert result.error == ""
        (device,) = result.devices

        pid = daemon_pid(pipe(root, uid))
        assert pid is not None
        assert visible_devices(pid) == mig_uuid
        assert query(pipe(root, uid), "get_default_active_thread_percentage") == "40.0"
        assert query(pipe(root, uid), "get_default_device_pinned_mem_limit 0") == "2048M"
        edits = rig.kubelet.resolve_cdi(device.cdi_ids)
        inside = f"/mps/dra-claims/{uid}/pipe"
        assert f"CUDA_MPS_PIPE_DIRECTORY={inside}" in edits["env"]
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        assert mounts[inside] == str(pipe(root, uid))
        assert mounts["/dev/shm"] == str(pipe(root, uid).parent / "shm")
        recorded = rig.checkpoint()["claims"][uid]["mpsDaemon"]
        assert (recorded["gpus"], recorded["threadPercentage"]) == ([mig_uuid], 40)

        client = await SimulatedClient.connect(mounts[inside])  # as the container reaches it
        assert client.limits["threads"] == 40.0
        assert await client.leave() == 0

        # TimeSlicing on another MIG device still works: no daemon
        other = next(n for n in sorted(devices) if "-mig-" in n and n != name)
        params = {**MIG_CONFIG, "sharing": {"strategy": "TimeSlicing"}}
        sliced = rig.put_claim("ts", other, config=[
            {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}
        ])  # fmt: skip
        assert (await rig.kubelet.prepare(DRIVER, [sliced]))[sliced[1]].error == ""
        assert not pipe(root, sliced[1]).exists()

        assert await rig.kubelet.unprepare(DRIVER, [claim, sliced]) == {uid: "", sliced[1]: ""}
        assert not runs(pid)
        assert rig.checkpoint()["claims"] == {}


async def test_a_partitions_daemon_is_quit_before_its_instance_is_destroyed(
    root: str, tmp_path: Path
) -> None:
    opts = DraOptions(dynamic_mig=True)
    async with dra_rig(root, tmp_path, hardware=HARDWARE, opts=opts) as rig:
        await rig.published(lambda d: THREE_AT_4 in d)
        claim = rig.put_claim("three", THREE_AT_4, config=mps(defaultActiveThreadPercentage=25))
        uid = claim[1]
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[uid].error == ""
        (made,) = await instances(rig, 0)
        pid = daemon_pid(pipe(root, uid))
        assert pid is not None
        assert visible_devices(pid) == made.uuid  # started once the instance exists
        client = await SimulatedClient.connect(str(pipe(root, uid)))

        # a client still there: the daemon is not quit, so the instance is kept (bounded wait)
        assert rig.mps is not None
        rig.mps.wait_s = 0.3
        (error,) = (await rig.kubelet.unprepare(DRIVER, [claim])).values()
        assert "MPS control daemon did not stop" in error
        assert runs(pid)
        assert [i.uuid for i in await instances(rig, 0)] == [made.uuid]

        assert await client.leave() == 0
        rig.mps.wait_s = 30.0
        assert await rig.kubelet.unprepare(DRIVER, [claim]) == {uid: ""}
        assert not runs(pid)
        assert await instances(rig, 0) == ()


async def test_a_failed_gpu_taints_a_partition_whose_claim_runs_mps(
    root: str, tmp_path: Path
) -> None:
    opts = DraOptions(dynamic_mig=True, taint_unhealthy=True)
    async with dra_rig(root, tmp_path, hardware=HARDWARE, opts=opts) as rig:
        await rig.published(lambda d: THREE_AT_4 in d)
        claim = rig.put_claim("three", THREE_AT_4, config=mps())
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
        await rig.health.mark(rig.gpu(0))
        await rig.published(lambda d: "taints" in d.get(THREE_AT_4, {}))
        health = await rig.kubelet.wait_health(
            DRIVER, lambda h: h.get((NODE, THREE_AT_4), (0, ""))[0] == UNHEALTHY
        )
        assert "health" in health[(NODE, THREE_AT_4)][1]
        assert await rig.kubelet.unprepare(DRIVER, [claim]) == {claim[1]: ""}  # still undone
        assert await instances(rig, 0) == ()


async def test_a_restart_adopts_restarts_and_quits_claim_daemons(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE) as rig:
        devices = await rig.published(lambda d: any("-mig-" in n for n in d))
        first, second = [n for n in sorted(devices) if "-mig-" in n][:2]
        kept = rig.put_claim("kept", first, config=mps(defaultActiveThreadPercentage=30))
        crashed = rig.put_claim("crashed", second, config=mps(defaultActiveThreadPercentage=60))
        prepared = await rig.kubelet.prepare(DRIVER, [kept, crashed])
        assert [r.error for r in prepared.values()] == ["", ""]
        kept_pid, crashed_pid = daemon_pid(pipe(root, kept[1])), daemon_pid(pipe(root, crashed[1]))
        assert kept_pid is not None
        assert crashed_pid is not None

        await rig.stop()  # the agent goes; its daemons run on
        assert runs(kept_pid)
        os.kill(crashed_pid, signal.SIGKILL)
        await gone(crashed_pid)
        orphan_root = os.path.join(root, "mps", "dra-claims", "no-such-claim")
        plan = DaemonPlan("dra-claims/no-such-claim", orphan_root, (rig.gpu(0),), (), 100)
        orphan = await LocalLauncher(SIMULATED_MPS_CONTROL).start(plan)

        await rig.start()
        await gone(orphan.pid)  # no completed claim owns it: quit
        assert daemon_pid(pipe(root, kept[1])) == kept_pid  # adopted
        assert query(pipe(root, kept[1]), "get_default_active_thread_percentage") == "30.0"
        restarted = await serving(rig, pipe(root, crashed[1]))  # started again
        assert restarted != crashed_pid
        assert query(pipe(root, crashed[1]), "get_default_active_thread_percentage") == "60.0"
        assert await rig.kubelet.unprepare(DRIVER, [kept, crashed]) == {kept[1]: "", crashed[1]: ""}
        assert not runs(kept_pid)


async def test_a_claim_rebuilt_from_the_api_server_gets_its_daemon_back(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE) as rig:
        devices = await rig.published(lambda d: any("-mig-" in n for n in d))
        name = next(n for n in sorted(devices) if "-mig-" in n)
        claim = rig.put_claim("mps", name, config=mps(defaultActiveThreadPercentage=35))
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
        pid = daemon_pid(pipe(root, claim[1]))
        assert pid is not None

        await restart_with(rig, torn)  # a checkpoint that is not one: rebuilt from the API
        recorded = rig.checkpoint()["claims"][claim[1]]["mpsDaemon"]
        assert recorded["threadPercentage"] == 35
        assert await serving(rig, pipe(root, claim[1])) == pid  # adopted, supervised again
        assert await rig.kubelet.unprepare(DRIVER, [claim]) == {claim[1]: ""}
        assert not runs(pid)  # quit by the unprepare


async def test_a_daemon_that_exits_holds_its_mig_device_unhealthy_until_it_is_back(
    root: str, tmp_path: Path
) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE) as rig:
        devices = await rig.published(lambda d: any("-mig-" in n for n in d))
        name = next(n for n in sorted(devices) if "-mig-" in n)
        claim = rig.put_claim("mps", name, config=mps())
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
        pid = daemon_pid(pipe(root, claim[1]))
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        health = await rig.kubelet.wait_health(
            DRIVER, lambda h: h.get((NODE, name), (0, ""))[0] == UNHEALTHY
        )
        assert "mps-claims" in health[(NODE, name)][1]
        # Healthy again with another daemon: a list still in flight from before the kill
        # (the hold while the first daemon started) is not taken for the daemon's return.
        await rig.kubelet.wait_health(
            DRIVER,
            lambda h: (
                h.get((NODE, name), (0, ""))[0] != UNHEALTHY
                and daemon_pid(pipe(root, claim[1])) not in (None, pid)
            ),
        )


async def test_a_bad_mps_config_is_one_line_and_starts_nothing(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path, hardware=HARDWARE) as rig:
        devices = await rig.published(lambda d: any("-mig-1g5gb-" in n for n in d))
        name = next(n for n in sorted(devices) if "-mig-1g5gb-" in n)
        claim = rig.put_claim("big", name, config=mps(defaultPinnedDeviceMemoryLimit="40Gi"))
        error = (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error
        assert "pinned memory limit of 40960 MiB" in error
        assert "\n" not in error
        assert not present(root, "mps")  # no daemon directory, no daemon
        assert not present(rig.plugin_dir, "checkpoint.json")  # nothing recorded
