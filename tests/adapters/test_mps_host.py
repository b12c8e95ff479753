"""adapters.mps.host: `gpuslice mps-control`'s socket with a real LocalLauncher and the
simulated control binary: a daemon started for the agent, found again, watched until
it exits; requests outside the host's MPS root and malformed ones refused in one line."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuslice.adapters.mps import ControlCommands, LocalLauncher, MpsHost, RemoteLauncher
from gpuslice.core.mps import DaemonPlan
from gpuslice.core.ports import MpsError

SIMULATED = [sys.executable, "-m", "gpuslice.testing.mps_control"]


@pytest.fixture
async def served() -> AsyncIterator[tuple[RemoteLauncher, Path]]:
    work = Path(tempfile.mkdtemp(prefix="gsh-", dir="/tmp"))
    root, stop = work / "mps", asyncio.Event()
    host = MpsHost(LocalLauncher(SIMULATED), str(root))
    socket = str(work / "host.sock")
    task = asyncio.create_task(host.serve(socket, stop))
    try:
        await asyncio.wait_for(host.serving.wait(), 5)
        yield RemoteLauncher(socket), root
    finally:
        stop.set()
        await task
        for pid_file in root.glob("*/*/pipe/nvidia-cuda-mps-control.pid"):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


def plan(root: Path, resource: str = "nvidia.com/gpu") -> DaemonPlan:
    return DaemonPlan(resource, str(root / resource), ("GPU-1",), (100,), 50)


async def test_a_daemon_started_through_the_host_is_found_and_watched(
    served: tuple[RemoteLauncher, Path],
) -> None:
    remote, root = served
    wanted = plan(root)
    daemon = await remote.start(wanted)
    assert daemon.gpu_uuids == ("GPU-1",)
    assert await remote.running(wanted.root) == daemon
    assert await remote.found(str(root)) == (daemon,)
    assert os.stat(os.path.dirname(remote.socket_path) + "/host.sock").st_mode & 0o777 == 0o600
    watch = asyncio.create_task(remote.exited(daemon))
    await ControlCommands(SIMULATED).quit(wanted)
    await asyncio.wait_for(watch, 5)
    assert await remote.running(wanted.root) is None


@pytest.mark.parametrize(
    "where",
    ["/elsewhere/nvidia.com/gpu", "{root}/nvidia.com", "{root}/a/b/c", "{root}/a/../b/c", "rel"],
)
async def test_directories_outside_the_hosts_root_are_refused(
    served: tuple[RemoteLauncher, Path], where: str
) -> None:
    remote, root = served
    target = where.format(root=root)
    wanted = DaemonPlan("nvidia.com/gpu", target, ("GPU-1",), (100,), 50)
    with pytest.raises(MpsError, match="is not a resource directory under this host's MPS root"):
        await remote.start(wanted)
    with pytest.raises(MpsError, match="is not a resource directory"):
        await remote.running(target)
    assert not list(root.glob("*/*/pipe"))


async def test_malformed_requests_get_one_line_and_start_nothing(
    served: tuple[RemoteLauncher, Path],
) -> None:
    remote, root = served
    for line in (b"not json\n", b"[1]\n", b'{"op": "start"}\n', b'{"op": "format"}\n'):
        reader, writer = await asyncio.open_unix_connection(remote.socket_path)
        writer.write(line)
        answer = json.loads(await reader.readline())
        writer.close()
        assert set(answer) == {"error"}
    bad = DaemonPlan("nvidia.com/gpu", str(root / "nvidia.com/gpu"), ("GPU 1; rm",), (1,), 50)
    with pytest.raises(MpsError, match="gpus must be GPU UUIDs"):
        await remote.start(bad)
    assert not root.exists() or not any(root.iterdir())


async def test_no_host_is_one_line_naming_the_socket(tmp_path: Path) -> None:
    remote = RemoteLauncher(str(tmp_path / "none.sock"))
    with pytest.raises(MpsError, match=r"^the MPS control host at .*none.sock does not answer"):
        await remote.running("/mps/nvidia.com/gpu")


async def test_a_pid_file_older_than_its_process_is_a_crashed_daemons(tmp_path: Path) -> None:
    """A process that got a crashed daemon's pid is not taken for that daemon."""
    pipe = tmp_path / "nvidia.com" / "gpu" / "pipe"
    pipe.mkdir(parents=True)
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    pid_file.write_text(str(os.getpid()))  # this test's process: it runs
    launcher = LocalLauncher(SIMULATED)
    found = await launcher.running(str(pipe.parent))
    assert found is not None
    assert found.pid == os.getpid()
    os.utime(pid_file, (1.0, 1.0))  # written in 1970: long before this process started
    assert await launcher.running(str(pipe.parent)) is None


@pytest.mark.parametrize(
    "answer",
    [{"daemons": 5}, {"daemons": {"root": "/mps"}}, {"daemons": [{"root": "/mps"}]}],
    ids=["a-number", "a-mapping", "a-daemon-without-pid"],
)
async def test_an_answer_of_the_wrong_shape_is_one_line(
    tmp_path: Path, answer: dict[str, object]
) -> None:
    async def host(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(json.dumps(answer).encode() + b"\n")
        await writer.drain()
        writer.close()

    socket = str(tmp_path / "host.sock")
    server = await asyncio.start_unix_server(host, socket)
    try:
        with pytest.raises(MpsError, match=r"^the MPS control host answered "):
            await RemoteLauncher(socket).found("/mps")
    finally:
        server.close()
        await server.wait_closed()
