"""The DRA checkpoint and per-claim CDI spec files: round trip, atomic replacement, the
checksum, the earlier format, bad files set aside, and the outside-file rules (no link
followed, regular files only, a size cap, a bad file is one line)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuslice.adapters.dra.checkpoint import MAX_BYTES, ClaimCheckpointFile
from gpuslice.adapters.dra.claim_specs import ClaimSpecDir
from gpuslice.core.dra.claims import ClaimRef, PreparedClaim, PreparedDevice
from gpuslice.core.errors import BackendError, BadCheckpoint
from gpuslice.core.isolation import Limit


def sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(MAX_BYTES + 1)


CLAIM = PreparedClaim(
    ClaimRef("ml", "uid-1", "train"),
    (PreparedDevice(("gpu",), "node-a", "gpu-0000-07-00-0", ("k8s.x/claim=uid-1-g",), "s1"),),
    "k8s.x-claim_uid-1.json",
    pods=("pod-1",),
    limits=(("GPU-1", Limit(3 << 30, 1 << 30)),),
)


async def test_checkpoint_round_trip_and_absent_file(tmp_path: Path) -> None:
    checkpoint = ClaimCheckpointFile(str(tmp_path))
    assert await checkpoint.load() == {}
    await checkpoint.save({"uid-1": CLAIM})
    assert await checkpoint.load() == {"uid-1": CLAIM}
    assert oct((tmp_path / "checkpoint.json").stat().st_mode & 0o777) == "0o600"
    await checkpoint.save({})
    assert await checkpoint.load() == {}
    assert os.listdir(tmp_path) == ["checkpoint.json"]  # no temporary left


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not a checkpoint"),
        (b'{"version": 9, "claims": {}}', "version 9, this agent reads 1"),
        (b'{"version": 1, "claims": {"u": {"namespace": 1}}}', "not a checkpoint"),
    ],
)
async def test_a_bad_checkpoint_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "checkpoint.json").write_bytes(content)
    with pytest.raises(BadCheckpoint, match=message) as err:
        await ClaimCheckpointFile(str(tmp_path)).load()
    assert "\n" not in str(err.value)


async def test_a_changed_byte_fails_the_checksum_and_the_earlier_format_loads(
    tmp_path: Path,
) -> None:
    checkpoint = ClaimCheckpointFile(str(tmp_path))
    await checkpoint.save({"uid-1": CLAIM})
    path = tmp_path / "checkpoint.json"
    saved = path.read_bytes()
    path.write_bytes(saved.replace(b"pod-1", b"pod-2"))
    with pytest.raises(BadCheckpoint, match="checksum mismatch"):
        await checkpoint.load()
    data = json.loads(saved)
    del data["checksum"]  # as the release before wrote it
    path.write_text(json.dumps(data))
    assert await checkpoint.load() == {"uid-1": CLAIM}


async def test_fields_a_newer_agent_adds_are_ignored_and_missing_ones_default(
    tmp_path: Path,
) -> None:
    checkpoint = ClaimCheckpointFile(str(tmp_path))
    claim = {"namespace": "ml", "name": "train", "devices": [], "migState": "PrepareStarted"}
    text = json.dumps({"version": 1, "claims": {"uid-1": claim}, "extra": {"a": 1}})
    (tmp_path / "checkpoint.json").write_text(text)
    (loaded,) = (await checkpoint.load()).values()
    assert loaded == PreparedClaim(ClaimRef("ml", "uid-1", "train"), (), "")


async def test_bad_files_are_moved_aside_and_only_the_newest_kept(tmp_path: Path) -> None:
    times = iter([1_800_000_000 + 10 * i for i in range(5)])
    checkpoint = ClaimCheckpointFile(str(tmp_path), clock=lambda: next(times))
    moved = []
    for i in range(5):
        (tmp_path / "checkpoint.json").write_text(f"torn {i}")
        moved.append(await checkpoint.set_aside())
    assert moved[0] == str(tmp_path / "checkpoint.json.bad-20270115T080000Z")
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(m) for m in moved[2:]]
    assert (tmp_path / os.path.basename(moved[4])).read_text() == "torn 4"


async def test_a_link_a_directory_or_a_huge_file_is_not_read(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"version": 1, "claims": {}}')
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "checkpoint.json").symlink_to(elsewhere)
    with pytest.raises(BadCheckpoint, match="is a symbolic link; refused"):
        await ClaimCheckpointFile(str(linked)).load()
    dir_case = tmp_path / "dir"
    (dir_case / "checkpoint.json").mkdir(parents=True)
    with pytest.raises(BadCheckpoint, match="is a directory, not a regular file; refused"):
        await ClaimCheckpointFile(str(dir_case)).load()
    huge = tmp_path / "huge"
    huge.mkdir()
    sparse(huge / "checkpoint.json")
    with pytest.raises(BadCheckpoint, match=f"larger than {MAX_BYTES} bytes; refused"):
        await ClaimCheckpointFile(str(huge)).load()


async def test_an_unwritable_checkpoint_is_a_transient_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(BackendError, match="cannot write") as err:
        await ClaimCheckpointFile(str(blocked / "sub")).save({"uid-1": CLAIM})
    assert err.value.transient


async def test_claim_specs_are_written_and_removed(tmp_path: Path) -> None:
    specs = ClaimSpecDir(tmp_path / "cdi")
    await specs.write("k8s.x-claim_u.json", "{}\n")
    assert (tmp_path / "cdi" / "k8s.x-claim_u.json").read_text() == "{}\n"
    await specs.remove("k8s.x-claim_u.json")
    await specs.remove("k8s.x-claim_u.json")  # gone already: fine
    assert os.listdir(tmp_path / "cdi") == []
    with pytest.raises(BackendError, match="not a plain file name"):
        await specs.write("../escape.json", "{}")
