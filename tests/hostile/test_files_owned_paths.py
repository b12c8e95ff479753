"""Files in directories the agent writes to but does not own alone: the device-plugin
directory's lock holder file, the MPS directories, the CDI spec directory. A planted
symlink is never followed, a FIFO or device never read, and what the agent creates gets
its mode whatever the umask."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuslice.adapters.cdi_file import CdiSpecDir
from gpuslice.adapters.deviceplugin.dirlock import HOLDER_FILE, DirLock, Holder
from gpuslice.adapters.mps import ControlCommands
from gpuslice.adapters.mps.local import prepare_dirs
from gpuslice.core.mps import DaemonPlan

ME = Holder(os.getpid(), pod="agent-a", node="n1")


@pytest.fixture
def umask_zero() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_symlink_at_the_holders_old_temp_name_is_not_followed(tmp_path: Path) -> None:
    """The temp file had a predictable name and was opened following links: a link
    planted there made the agent overwrite the kubelet's checkpoint."""
    victim = tmp_path / "kubelet_internal_checkpoint"
    victim.write_text("kubelet's")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / f"{HOLDER_FILE}.{ME.pid}.tmp").symlink_to(victim)
    lock = DirLock(str(plugins), ME)
    assert lock.try_acquire()
    try:
        assert victim.read_text() == "kubelet's"
        assert json.loads((plugins / HOLDER_FILE).read_text())["pod"] == "agent-a"
    finally:
        lock.release()


def test_a_symlinked_holder_file_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / HOLDER_FILE).symlink_to(victim)
    lock = DirLock(str(plugins), ME)
    assert lock.try_acquire()
    lock.release()
    assert victim.read_text() == "keep"


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_the_holder_file_is_never_read_through_a_fifo_or_device(tmp_path: Path, kind: str) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    holder = plugins / HOLDER_FILE
    if kind == "fifo":
        os.mkfifo(holder)
    else:
        holder.symlink_to("/dev/zero")
    waiting = DirLock(str(plugins), Holder(1))
    assert waiting.holder().startswith("a process that left no readable")  # at once


def test_mps_directories_are_never_changed_through_a_link(tmp_path: Path) -> None:
    """An shm link elsewhere was made world-writable (1777)."""
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir(mode=0o755)
    root = tmp_path / "mps" / "nvidia.com" / "gpu"
    root.mkdir(parents=True)
    (root / "shm").symlink_to(elsewhere)
    plan = DaemonPlan("nvidia.com/gpu", str(root), ("GPU-0",), (1024,), 50)
    with pytest.raises(OSError, match=r"shm: is a symbolic link, not a directory; refused$"):
        prepare_dirs(plan)
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755


def test_mps_directories_get_their_modes_whatever_the_umask(
    tmp_path: Path, umask_zero: None
) -> None:
    root = tmp_path / "mps" / "r"
    plan = DaemonPlan("r", str(root), ("GPU-0",), (1024,), 50)
    prepare_dirs(plan)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in root.iterdir()}
    assert modes == {"pipe": 0o755, "log": 0o755, "shm": 0o1777}
    assert stat.S_IMODE(root.stat().st_mode) == 0o755


async def test_a_control_command_running_when_the_agent_stops_is_killed(tmp_path: Path) -> None:
    """One more stray command per restart before: cancelling a command kills it."""
    script = (
        "import os, sys, time; print(os.getpid(), flush=True); sys.stdin.read(); time.sleep(60)"
    )
    plan = DaemonPlan("r", str(tmp_path / "mps"), ("GPU-0",), (1024,), 50)
    started: list[asyncio.subprocess.Process] = []
    real = asyncio.create_subprocess_exec

    async def spawn(*args: object, **kwargs: object) -> asyncio.subprocess.Process:
        proc = await real(*args, **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc

    commands = ControlCommands([sys.executable, "-c", script])
    monkey = pytest.MonkeyPatch()
    monkey.setattr(asyncio, "create_subprocess_exec", spawn)
    try:
        task = asyncio.create_task(commands.send(plan, ["get_server_list"]))
        assert started or await _until(lambda: bool(started))
    finally:
        monkey.undo()
    (proc,) = started
    pid = proc.pid
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_the_cdi_directory_is_created_0755_whatever_the_umask(
    tmp_path: Path, umask_zero: None
) -> None:
    """0777 under umask 0 before: anyone could add specs the runtime trusts."""
    cdi = tmp_path / "run" / "cdi"
    await CdiSpecDir(cdi).sync({"k8s.device-plugin.nvidia.com-gpu.json": "{}\n"})
    assert stat.S_IMODE(cdi.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o755


async def test_a_fifo_in_a_specs_place_is_replaced_not_read(tmp_path: Path) -> None:
    """Nothing was ever served before, and SIGTERM was ignored."""
    name = "k8s.device-plugin.nvidia.com-gpu.json"
    os.mkfifo(tmp_path / name)
    changed = await asyncio.wait_for(CdiSpecDir(tmp_path).sync({name: "{}\n"}), 5)
    assert changed == (name,)
    assert (tmp_path / name).read_text() == "{}\n"


async def _until(done: Callable[[], bool]) -> bool:
    """Yield to the loop until `done()` (the subprocess is started by the task)."""
    for _ in range(10_000):
        if done():
            return True
        await asyncio.sleep(0)
    return done()
