"""A DRA checkpoint that is not one (torn, a byte flipped, a save killed before its rename)
never stops the node: the bad file is set aside, the agent serves prepare and unprepare at
once, the claims the API server still holds allocated here are prepared again from their
ResourceClaims, and one log line names what was lost. A file of the earlier format (no
checksum) is read as it is. Real files, the real DRA gRPC over unix sockets, the kubelet
and API server stand-ins."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from agent_harness import remove_dir, short_dir
from conftest import Logged
from dra_harness import DRIVER, DraRig, dra_rig
from faults_harness import eventually

from gpuslice.testing.apiserver.access import Grant

GPU0 = "gpu-0000-07-00-0"  # dgx-a100's first GPU, by PCI bus ID
GPU1 = "gpu-0000-0f-00-0"
DRA_GROUP = "resource.k8s.io"
Claim = tuple[str, str, str]


@pytest.fixture
def root() -> AsyncIterator[str]:
    path = short_dir("gsr-")
    yield path
    remove_dir(path)


def torn(data: bytes) -> bytes:
    """A save cut short mid-JSON (a crash of the node before the data reached the disk)."""
    return data[: len(data) // 2]


def flipped(data: bytes) -> bytes:
    """One bit changed inside the claims: still JSON, the checksum no longer matches."""
    at = data.index(b'"pool":"node-a"') + len(b'"pool":"node-')
    return data[:at] + bytes([data[at] ^ 0x20]) + data[at + 1 :]


def spec_name(claim: Claim) -> str:
    return f"k8s.gpu.nvidia.com-claim_{claim[1]}.json"


def rebuilt_lines(logged: Logged) -> list[dict[str, object]]:
    return [dict(e) for e in logged if e["event"] == "dra_checkpoint_rebuilt"]


async def restart_with(rig: DraRig, damage: Callable[[bytes], bytes]) -> bytes:
    """Stop the agent, damage its checkpoint, start a new one; the damaged bytes."""
    await rig.stop()
    bad = damage(read(rig, "checkpoint.json"))
    write(rig, "checkpoint.json", bad)
    await rig.start()
    await rig.kubelet.discover(DRIVER)
    await rig.frontend.driver.settled.wait()
    return bad


def read(rig: DraRig, name: str) -> bytes:
    """A file of the plugin's directory."""
    return Path(rig.plugin_dir, name).read_bytes()


def write(rig: DraRig, name: str, data: bytes) -> None:
    Path(rig.plugin_dir, name).write_bytes(data)


def no_claim_list(rig: DraRig) -> None:
    """RBAC that lets the agent read a claim but not list them."""
    rig.api.grants = [
        Grant(DRA_GROUP, frozenset({"resourceslices"}),
              frozenset({"list", "watch", "create", "update", "delete"})),
        Grant(DRA_GROUP, frozenset({"resourceclaims"}), frozenset({"get"})),
    ]  # fmt: skip


@pytest.mark.parametrize("damage", [torn, flipped], ids=["torn", "flipped-byte"])
async def test_a_bad_checkpoint_is_set_aside_and_rebuilt_from_the_api_server(
    root: str, tmp_path: Path, logged: Logged, damage: Callable[[bytes], bytes]
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: GPU0 in d and GPU1 in d)
        kept, gone = rig.put_claim("kept", GPU0), rig.put_claim("gone", GPU1)
        before = await rig.kubelet.prepare(DRIVER, [kept, gone])
        assert [r.error for r in before.values()] == ["", ""]
        del rig.api.dra.claims[("ml", "gone")]  # its pod ended while the agent was down
        bad = await restart_with(rig, damage)

        # one line: why, where the file went, what came back and what was lost
        (line,) = rebuilt_lines(logged)
        assert line["recovered"] == kept[1]
        assert line["lost"] == gone[1]
        path = os.path.join(rig.plugin_dir, "checkpoint.json")
        assert str(line["reason"]).startswith(f"DRA checkpoint {path}: ")
        aside = str(line["moved_to"]).removeprefix(rig.plugin_dir + "/")
        assert read(rig, aside) == bad  # kept beside it, for a person to look at
        (event,) = [e for e in rig.api.events if e["reason"] == "DraCheckpointRebuilt"]
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "Node"
        assert event["metadata"]["namespace"] == "default"
        assert event["message"].endswith(f"claims prepared again: 1; lost: {gone[1]}")
        status = rig.frontend.status()
        assert status["checkpointRebuilt"]["lost"] == [gone[1]]
        assert status["checkpointRebuilt"]["recovered"] == 1
        assert "checkpointError" not in status

        # the kept claim is prepared again, its spec in place; the lost one's spec is gone
        assert rig.spec_files() == [spec_name(kept)]
        assert list(rig.checkpoint()["claims"]) == [kept[1]]
        reads = len(rig.api.of("GET", "resourceclaims"))
        again = await rig.kubelet.prepare(DRIVER, [kept])
        assert again == {kept[1]: before[kept[1]]}
        assert len(rig.api.of("GET", "resourceclaims")) == reads  # from the checkpoint
        # the kubelet unprepares the lost claim: nothing to do, no error
        assert await rig.kubelet.unprepare(DRIVER, [gone]) == {gone[1]: ""}
        # and the node serves on: GPU0 is still held, GPU1 free again
        other = rig.put_claim("other", GPU1)
        assert (await rig.kubelet.prepare(DRIVER, [other]))[other[1]].error == ""
        thief = rig.put_claim("thief", GPU0)
        assert "is prepared for claim ml/kept" in (
            (await rig.kubelet.prepare(DRIVER, [thief]))[thief[1]].error
        )
        assert await rig.kubelet.unprepare(DRIVER, [kept, other]) == {kept[1]: "", other[1]: ""}
        assert rig.spec_files() == []


async def test_bad_files_set_aside_are_kept_a_few_at_most(root: str, tmp_path: Path) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: GPU0 in d)
        claim = rig.put_claim("a", GPU0)
        assert (await rig.kubelet.prepare(DRIVER, [claim]))[claim[1]].error == ""
        for _ in range(5):
            await restart_with(rig, torn)
            assert rig.spec_files() == [spec_name(claim)]  # rebuilt each time
        aside = [n for n in os.listdir(rig.plugin_dir) if n.startswith("checkpoint.json.bad-")]
        assert len(aside) == 3


async def test_the_kubelet_re_establishes_what_the_api_server_could_not_give(
    root: str, tmp_path: Path, logged: Logged
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: GPU0 in d and GPU1 in d)
        a, b = rig.put_claim("a", GPU0), rig.put_claim("b", GPU1)
        before = await rig.kubelet.prepare(DRIVER, [a, b])
        no_claim_list(rig)
        await restart_with(rig, torn)
        # the API server refused the list: the specs stay (their pods may run), no loss claimed
        assert rig.spec_files() == sorted([spec_name(a), spec_name(b)])
        assert rebuilt_lines(logged) == []
        assert rig.frontend.status()["checkpointRebuilt"]["unverified"] == 2
        # the kubelet prepares one again (a kubelet restart): it is recorded again
        assert await rig.kubelet.prepare(DRIVER, [a]) == {a[1]: before[a[1]]}
        assert list(rig.checkpoint()["claims"]) == [a[1]]
        # and unprepares the other (its pod ended): unknown here, its spec goes
        assert await rig.kubelet.unprepare(DRIVER, [b]) == {b[1]: ""}
        assert rig.spec_files() == [spec_name(a)]
        assert rig.frontend.status()["checkpointRebuilt"].get("unverified") is None
        assert await rig.kubelet.unprepare(DRIVER, [a]) == {a[1]: ""}
        assert rig.spec_files() == []


async def test_the_rebuild_waits_for_the_api_server_and_then_completes(
    root: str, tmp_path: Path, logged: Logged
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: GPU0 in d and GPU1 in d)
        kept, gone = rig.put_claim("kept", GPU0), rig.put_claim("gone", GPU1)
        await rig.kubelet.prepare(DRIVER, [kept, gone])
        del rig.api.dra.claims[("ml", "gone")]
        no_claim_list(rig)
        await restart_with(rig, flipped)
        assert any(e["event"] == "dra_checkpoint_rebuild_waiting" for e in logged)
        rig.api.grants = None  # the RBAC fixed: the next try reads the claims
        await eventually(lambda: bool(rebuilt_lines(logged)), "the rebuild completing")
        (line,) = rebuilt_lines(logged)
        assert (line["recovered"], line["lost"]) == (kept[1], gone[1])
        assert rig.spec_files() == [spec_name(kept)]
        assert list(rig.checkpoint()["claims"]) == [kept[1]]


async def test_a_save_killed_before_its_rename_loses_nothing(
    root: str, tmp_path: Path, logged: Logged
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: GPU0 in d and GPU1 in d)
        a = rig.put_claim("a", GPU0)
        assert (await rig.kubelet.prepare(DRIVER, [a]))[a[1]].error == ""
        await rig.stop()
        # what a kill between writing the temporary file and renaming it leaves
        leftover = ".checkpoint.json.0123456789abcdef.tmp"
        write(rig, leftover, read(rig, "checkpoint.json")[:40])
        await rig.start()
        await rig.kubelet.discover(DRIVER)
        await rig.frontend.driver.settled.wait()
        assert rebuilt_lines(logged) == []
        assert list(rig.frontend.driver.prepared) == [a[1]]
        b = rig.put_claim("b", GPU1)
        assert (await rig.kubelet.prepare(DRIVER, [b]))[b[1]].error == ""
        assert leftover not in os.listdir(rig.plugin_dir)  # gone with this agent's first save
        assert await rig.kubelet.unprepare(DRIVER, [a, b]) == {a[1]: "", b[1]: ""}
        assert rig.spec_files() == []


async def test_a_checkpoint_of_the_earlier_format_still_loads(
    root: str, tmp_path: Path, logged: Logged
) -> None:
    async with dra_rig(root, tmp_path) as rig:
        await rig.published(lambda d: GPU0 in d)
        a = rig.put_claim("a", GPU0)
        before = await rig.kubelet.prepare(DRIVER, [a])
        await rig.stop()
        # as the release before this one wrote it: no checksum, no pods or limits
        claims = json.loads(read(rig, "checkpoint.json"))["claims"]
        for claim in claims.values():
            del claim["pods"], claim["limits"]
        write(rig, "checkpoint.json", json.dumps({"version": 1, "claims": claims}).encode())
        rig.api.dra.claims.clear()  # nothing to rebuild from: it must be read
        await rig.start()
        await rig.kubelet.discover(DRIVER)
        assert await rig.kubelet.prepare(DRIVER, [a]) == before
        assert rebuilt_lines(logged) == []
        assert await rig.kubelet.unprepare(DRIVER, [a]) == {a[1]: ""}
        assert rig.spec_files() == []
        assert "checksum" in rig.checkpoint()  # written in the new format from then on
