"""CdiSpecDir: CDI spec files replaced atomically, only on change, removed when unwanted."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from gpuslice.adapters.cdi_file import MAX_BYTES as CDI_MAX_BYTES
from gpuslice.adapters.cdi_file import CdiSpecDir, find_toolkit_devices, present_nodes
from gpuslice.core.errors import BackendError

GPU = "k8s.device-plugin.nvidia.com-gpu.json"
IMEX = "k8s.device-plugin.nvidia.com-imex-channel.json"


def spec(*names: str) -> str:
    devices = [{"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}} for n in names]
    return json.dumps({"cdiVersion": "0.3.0", "kind": "k8s.device-plugin.nvidia.com/gpu",
                       "devices": devices})  # fmt: skip


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def hidden(directory: Path) -> list[str]:
    """Temporary files left behind (they start with '.')."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


async def test_writes_each_spec_creating_the_directory(tmp_path: Path) -> None:
    cdi = tmp_path / "run" / "cdi"
    store = CdiSpecDir(cdi)
    assert await store.sync({GPU: spec("GPU-a"), IMEX: spec("0")}) == (GPU, IMEX)
    assert (cdi / GPU).read_text() == spec("GPU-a")
    assert (cdi / IMEX).read_text() == spec("0")
    assert stat.S_IMODE((cdi / GPU).stat().st_mode) == 0o644
    assert hidden(cdi) == []


async def test_unchanged_content_is_not_rewritten(tmp_path: Path) -> None:
    """Neither by the same store nor by a new one (a restarted agent)."""
    store = CdiSpecDir(tmp_path)
    await store.sync({GPU: spec("GPU-a")})
    before = (tmp_path / GPU).stat()
    assert await store.sync({GPU: spec("GPU-a")}) == ()
    assert await CdiSpecDir(tmp_path).sync({GPU: spec("GPU-a")}) == ()
    after = (tmp_path / GPU).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


async def test_a_change_replaces_the_file_by_rename(tmp_path: Path) -> None:
    store = CdiSpecDir(tmp_path)
    await store.sync({GPU: spec("GPU-a")})
    inode = (tmp_path / GPU).stat().st_ino
    assert await store.sync({GPU: spec("GPU-a", "GPU-b")}) == (GPU,)
    assert (tmp_path / GPU).stat().st_ino != inode
    assert (tmp_path / GPU).read_text() == spec("GPU-a", "GPU-b")
    assert hidden(tmp_path) == []


async def test_a_spec_no_longer_wanted_is_deleted_but_not_other_files(tmp_path: Path) -> None:
    """Files this store did not write (another vendor's, the toolkit's) stay."""
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    store = CdiSpecDir(tmp_path)
    await store.sync({GPU: spec("GPU-a"), IMEX: spec("0")})
    assert await store.sync({GPU: spec("GPU-a")}) == (IMEX,)
    assert await store.sync({}) == (GPU,)
    assert listing(tmp_path) == ["nvidia.yaml"]
    assert await store.sync({}) == ()


async def test_a_spec_from_an_earlier_process_is_replaced_not_deleted(tmp_path: Path) -> None:
    """A new store only deletes what it holds; the same name it writes again."""
    await CdiSpecDir(tmp_path).sync({GPU: spec("GPU-old")})
    store = CdiSpecDir(tmp_path)
    assert await store.sync({}) == ()
    assert (tmp_path / GPU).exists()
    assert await store.sync({GPU: spec("GPU-new")}) == (GPU,)
    assert await store.sync({}) == (GPU,)
    assert not (tmp_path / GPU).exists()


async def test_a_spec_found_in_place_is_held_without_a_rewrite(tmp_path: Path) -> None:
    """After a restart the same spec is already there: kept as it is (no rename under a
    runtime reading it), and deleted like the store's own once it is no longer wanted."""
    await CdiSpecDir(tmp_path).sync({GPU: spec("GPU-a")})
    inode = (tmp_path / GPU).stat().st_ino
    store = CdiSpecDir(tmp_path)
    assert await store.sync({GPU: spec("GPU-a")}) == ()
    assert (tmp_path / GPU).stat().st_ino == inode
    assert await store.sync({}) == (GPU,)
    assert listing(tmp_path) == []


async def test_a_reader_never_sees_a_partial_spec(tmp_path: Path) -> None:
    """Large specs replaced back to back: every read parses as one whole generation."""
    store = CdiSpecDir(tmp_path)

    def generation(n: int) -> str:
        return spec(*(f"GPU-{n}-{i:05d}" for i in range(2000)))

    await store.sync({GPU: generation(0)})
    stop = threading.Event()
    torn: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            text = (tmp_path / GPU).read_text()
            reads += 1
            try:
                names = {d["name"].split("-")[1] for d in json.loads(text)["devices"]}
            except ValueError as exc:
                torn.append(str(exc))
                continue
            if len(names) != 1:
                torn.append(f"{len(names)} generations")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(1, 30):
            assert await store.sync({GPU: generation(n)}) == (GPU,)
    finally:
        stop.set()
        thread.join()
    assert reads > 0
    assert torn == []
    assert hidden(tmp_path) == []


async def test_an_unwritable_directory_is_a_one_line_transient_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(
        BackendError, match=r"CDI spec .*not-a-dir/.*-gpu.json: cannot write"
    ) as err:
        await CdiSpecDir(blocker).sync({GPU: spec("GPU-a")})
    assert "\n" not in str(err.value)
    assert err.value.transient


def test_present_nodes_lists_what_matches_on_this_node(tmp_path: Path) -> None:
    for name in ("nvidia-fs1", "nvidia-fs0", "gdrdrv"):
        (tmp_path / name).write_text("")
    patterns = (f"{tmp_path}/nvidia-fs*", f"{tmp_path}/missing", f"{tmp_path}/gdrdrv")
    assert present_nodes(patterns) == tuple(
        f"{tmp_path}/{n}" for n in ("nvidia-fs0", "nvidia-fs1", "gdrdrv")
    )


def test_the_toolkits_spec_is_found_among_others(tmp_path: Path) -> None:
    """The toolkit's nvidia.yaml (kind nvidia.com/gpu) beside another vendor's spec and
    ours; a FIFO or a spec above the size cap is skipped, never read."""
    (tmp_path / "amd.yaml").write_text("cdiVersion: 0.5.0\nkind: amd.com/gpu\ndevices: []\n")
    (tmp_path / GPU).write_text(spec("GPU-a"))
    os.mkfifo(tmp_path / "a-fifo.yaml")
    with open(tmp_path / "big.json", "wb") as fh:
        fh.truncate(CDI_MAX_BYTES + 1)
    (tmp_path / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-a\n- name: '0'\n"
    )
    found = find_toolkit_devices(tmp_path)
    assert (found.names, found.source, found.problem) == (
        frozenset({"GPU-a", "0"}), str(tmp_path / "nvidia.yaml"), None,
    )  # fmt: skip
    assert found.name_for("GPU-a", "0") == "nvidia.com/gpu=GPU-a"
    assert found.name_for("GPU-b", "0") == "nvidia.com/gpu=0"
    assert found.name_for("GPU-c", "1") is None


@pytest.mark.parametrize("content", [None, "kind: nvidia.com/gpu\ndevices: &a [*a]\n", "{{"])
def test_no_toolkit_spec_is_one_line(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / "nvidia.yaml").write_text(content)
    found = find_toolkit_devices(tmp_path)
    assert found.names == frozenset()
    assert found.problem is not None
    assert "\n" not in found.problem
    assert found.problem.startswith(f"no CDI spec of kind nvidia.com/gpu in {tmp_path}")
