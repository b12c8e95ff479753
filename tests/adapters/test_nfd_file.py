"""FeatureFile: NFD features.d output written atomically, only on real changes."""

from __future__ import annotations

import io
import stat
import threading
from pathlib import Path

import pytest

from gpuslice.adapters.nfd_file import DEFAULT_PATH, FeatureFile, parse
from gpuslice.core.errors import BackendError
from gpuslice.core.labels import TIMESTAMP_LABEL

LABELS = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "4", TIMESTAMP_LABEL: "100"}


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_default_path_is_gfds() -> None:
    assert DEFAULT_PATH == "/etc/kubernetes/node-feature-discovery/features.d/gfd"


async def test_writes_sorted_key_value_lines_creating_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "features.d" / "gfd"
    assert await FeatureFile(path).publish(LABELS)
    assert path.read_text() == (
        "nvidia.com/gfd.timestamp=100\nnvidia.com/gpu.count=4\nnvidia.com/gpu.product=Tesla-T4\n"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert leftovers(path.parent) == []


async def test_a_new_timestamp_alone_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    sink = FeatureFile(path)
    await sink.publish(LABELS)
    before = path.stat()
    assert not await sink.publish({**LABELS, TIMESTAMP_LABEL: "160"})
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert parse(path.read_text())[TIMESTAMP_LABEL] == "100"


async def test_unchanged_labels_written_by_an_earlier_process_are_left_alone(
    tmp_path: Path,
) -> None:
    """A restarted agent with a fresh timestamp does not rewrite the file."""
    path = tmp_path / "gfd"
    await FeatureFile(path).publish(LABELS)
    inode = path.stat().st_ino
    assert not await FeatureFile(path).publish({**LABELS, TIMESTAMP_LABEL: "999"})
    assert path.stat().st_ino == inode


async def test_a_real_change_replaces_the_file_by_rename(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    sink = FeatureFile(path)
    await sink.publish(LABELS)
    inode = path.stat().st_ino
    assert await sink.publish({**LABELS, "nvidia.com/gpu.replicas": "4"})
    assert path.stat().st_ino != inode
    assert parse(path.read_text())["nvidia.com/gpu.replicas"] == "4"
    assert leftovers(tmp_path) == []


async def test_a_file_edited_by_hand_is_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    path.write_text("garbage without an equals sign\nnvidia.com/gpu.count=4\n")
    assert await FeatureFile(path).publish(LABELS)
    assert parse(path.read_text()) == LABELS


async def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    """Large label sets replaced back to back: every read is one whole generation."""
    path = tmp_path / "gfd"
    sink = FeatureFile(path)
    size = 3000

    def generation(n: int) -> dict[str, str]:
        return {f"example.com/label-{i:05d}": f"gen-{n}" for i in range(size)}

    await sink.publish(generation(0))
    stop = threading.Event()
    torn: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            got = parse(path.read_text())
            reads += 1
            if len(got) != size or len(set(got.values())) != 1:
                torn.append(f"{len(got)} labels, {len(set(got.values()))} generations")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(1, 40):
            assert await sink.publish(generation(n))
    finally:
        stop.set()
        thread.join()
    assert reads > 0
    assert torn == []
    assert leftovers(tmp_path) == []


async def test_an_unwritable_path_is_a_one_line_backend_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(BackendError, match=r"features file .*not-a-dir/gfd: cannot write") as err:
        await FeatureFile(blocker / "gfd").publish(LABELS)
    assert "\n" not in str(err.value)
    assert err.value.transient


async def test_a_failed_rename_leaves_no_temporary_file(tmp_path: Path) -> None:
    """The target is a directory, so the final rename fails after the temp file exists."""
    (tmp_path / "gfd" / "inside").mkdir(parents=True)
    with pytest.raises(BackendError, match="cannot write"):
        await FeatureFile(tmp_path / "gfd").publish(LABELS)
    assert leftovers(tmp_path) == []


async def test_remove_deletes_the_file_and_tolerates_its_absence(tmp_path: Path) -> None:
    path = tmp_path / "gfd"
    sink = FeatureFile(path)
    await sink.publish(LABELS)
    await sink.remove()
    assert not path.exists()
    await sink.remove()


async def test_empty_path_prints_to_the_stream_only_on_change() -> None:
    out = io.StringIO()
    sink = FeatureFile("", stream=out)
    assert sink.path is None
    assert await sink.publish(LABELS)
    assert not await sink.publish({**LABELS, TIMESTAMP_LABEL: "160"})
    assert await sink.publish({**LABELS, "nvidia.com/gpu.count": "8"})
    printed = out.getvalue().splitlines()
    assert len(printed) == 6
    assert printed[:3] == sorted(f"{k}={v}" for k, v in LABELS.items())
    await sink.remove()  # nothing to delete


async def test_a_path_that_cannot_be_removed_is_a_backend_error(tmp_path: Path) -> None:
    (tmp_path / "gfd").mkdir()
    with pytest.raises(BackendError, match="cannot remove"):
        await FeatureFile(tmp_path / "gfd").remove()
