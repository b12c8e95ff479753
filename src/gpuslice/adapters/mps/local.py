"""MPS control daemons run from this process: each started with `<binary> -d` in its
resource's directories, found again through the pid file it writes in its pipe
directory, and watched with a pidfd. `-d` detaches the daemon, so it outlives this
process; it lives as long as the container (the cgroup) it was started in.

What a daemon was started with is recorded in `<root>/daemon.json` (its pid and
GPUs), beside its pipe, log and shm directories and out of the clients' sight, so that
a later agent can tell whether a daemon it finds serves the plan it wants.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from gpuslice.adapters.mps.commands import run
from gpuslice.adapters.outside_files import own_dir, read_text, replace_atomically
from gpuslice.core.mps import DaemonPlan, RunningDaemon
from gpuslice.core.ports import MpsError

PID_FILE = "nvidia-cuda-mps-control.pid"
RECORD = "daemon.json"
_SMALL = 4096  # a pid file or a record is a few bytes
_CLOCK_SLACK_S = 2.0  # btime has whole seconds; a daemon writes its pid file once started


class LocalLauncher:
    def __init__(self, binary: Sequence[str]) -> None:
        self._binary = tuple(binary)

    async def start(self, plan: DaemonPlan) -> RunningDaemon:
        """Start the daemon of `plan` and record it. Raises MpsError."""
        try:
            await asyncio.to_thread(prepare_dirs, plan)
        except OSError as exc:
            raise MpsError(f"MPS directory of {plan.resource}: {exc}") from None
        code, out = await run(self._binary, ["-d"], plan.env, "")
        name = os.path.basename(self._binary[-1])
        if code != 0:
            raise MpsError(f"{name} -d exited with status {code}: {out.strip()}")
        pid = await asyncio.to_thread(_pid, plan.root)
        if pid is None:
            raise MpsError(f"{name} -d returned, but no daemon runs in {plan.pipe_dir}")
        record = json.dumps({"pid": pid, "gpus": list(plan.gpu_uuids)})
        try:
            await asyncio.to_thread(replace_atomically, Path(plan.root, RECORD), record)
        except OSError as exc:
            raise MpsError(f"cannot record the MPS daemon of {plan.resource}: {exc}") from None
        return RunningDaemon(plan.root, pid, plan.gpu_uuids)

    async def running(self, root: str) -> RunningDaemon | None:
        """The daemon running in `root`'s pipe directory, if any."""
        return await asyncio.to_thread(_running, root)

    async def found(self, mps_root: str) -> tuple[RunningDaemon, ...]:
        """Every daemon running under `mps_root` (<mpsRoot>/<domain>/<name>/pipe)."""
        return await asyncio.to_thread(_found, mps_root)

    async def exited(self, daemon: RunningDaemon) -> None:
        """Return once `daemon` has exited."""
        await gone(daemon.pid)


def prepare_dirs(plan: DaemonPlan) -> None:
    """Pipe and log directories (0755, traversable by any UID) and the shared-memory
    directory (1777, as /dev/shm) of this resource. Each must be a directory of this
    process's user, not a symlink: a mode is never set through a link. Raises OSError."""
    for path, mode in ((plan.pipe_dir, 0o755), (plan.log_dir, 0o755), (plan.shm_dir, 0o1777)):
        own_dir(path, mode)


def _running(root: str) -> RunningDaemon | None:
    pid = _pid(root)
    if pid is None:
        return None
    try:
        record = json.loads(read_text(os.path.join(root, RECORD), limit=_SMALL, follow=False))
        gpus = tuple(str(g) for g in record["gpus"]) if record["pid"] == pid else None
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        gpus = None
    return RunningDaemon(root, pid, gpus)


def _found(mps_root: str) -> tuple[RunningDaemon, ...]:
    found = []
    for domain in _subdirs(mps_root):
        for name in _subdirs(domain):
            daemon = _running(name)
            if daemon is not None:
                found.append(daemon)
    return tuple(found)


def _subdirs(path: str) -> list[str]:
    """The directories in `path` (links not followed; none when it is not a directory)."""
    try:
        with os.scandir(path) as entries:
            return sorted(e.path for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _pid(root: str) -> int | None:
    """The pid in the daemon's pid file while that process runs: a process started after
    the file was written is another one that got a crashed daemon's pid."""
    path = os.path.join(root, "pipe", PID_FILE)
    try:
        pid = int(read_text(path, limit=_SMALL, follow=False).strip())
        if check_running(pid) > os.stat(path, follow_symlinks=False).st_mtime + _CLOCK_SLACK_S:
            return None
    except (OSError, ValueError):
        return None
    return pid


async def gone(pid: int) -> None:
    """Return once process `pid` has exited (reaped here when it is our child)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop, done = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(fd, done.set)
    try:
        await done.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks


def check_running(pid: int) -> float:
    """When `pid` started (seconds since the epoch); OSError unless it runs: a zombie
    (exited, not yet reaped by its parent) does not."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        raise ProcessLookupError(pid)
    return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise OSError("no btime in /proc/stat")
