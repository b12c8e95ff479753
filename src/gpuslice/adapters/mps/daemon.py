"""One MPS control daemon: started with `-d` in its own pipe and log directories,
driven by piping commands to `<binary>` (as upstream does), watched through the pid
file it writes in its pipe directory, and stopped with `quit`."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence

from gpuslice.adapters.outside_files import own_dir, read_text
from gpuslice.core.mps import DaemonPlan
from gpuslice.core.ports import MpsError

PID_FILE = "nvidia-cuda-mps-control.pid"
COMMAND_TIMEOUT_S = 10.0
PROBE_S = 10.0


class ControlDaemon:
    def __init__(self, plan: DaemonPlan, binary: Sequence[str]) -> None:
        self.plan = plan
        self._binary = tuple(binary)
        self._env = {**os.environ, **plan.env}

    def prepare_dirs(self) -> None:
        """Pipe and log directories (0755, traversable by any UID) and the shared-memory
        directory (1777, as /dev/shm) of this resource. Each must be a directory of this
        process's user, not a symlink: a mode is never set through a link. Raises
        MpsError."""
        wanted = ((self.plan.pipe_dir, 0o755), (self.plan.log_dir, 0o755))
        try:
            for path, mode in (*wanted, (self.plan.shm_dir, 0o1777)):
                own_dir(path, mode)
        except OSError as exc:
            raise MpsError(f"MPS directory of {self.plan.resource}: {exc}") from None

    async def start(self) -> None:
        """Start the daemon and set its limits; raises MpsError unless it answers them."""
        self.prepare_dirs()
        if self.pid() is not None:  # ours from before, or a stray one: replaced
            await self.quit()
        code, out = await self._run(["-d"], "")
        if code != 0:
            raise MpsError(f"{self._name} -d exited with status {code}: {out.strip()}")
        await self.send(self.plan.set_commands())
        pinned = [
            await self.send([f"get_default_device_pinned_mem_limit {i}"])
            for i in range(len(self.plan.gpu_uuids))
        ]
        wrong = self.plan.mismatches(
            pinned, await self.send(["get_default_active_thread_percentage"])
        )
        if wrong:
            raise MpsError(
                f"the MPS daemon of {self.plan.resource} kept other limits: {'; '.join(wrong)}"
            )

    async def send(self, commands: Sequence[str]) -> str:
        """Pipe `commands` to the daemon; its answer. Raises MpsError."""
        code, out = await self._run([], "".join(f"{c}\n" for c in commands))
        if code != 0:
            raise MpsError(f"{self._name} {commands[0]!r} exited with status {code}: {out.strip()}")
        return out.strip()

    async def quit(self) -> None:
        """Stop the daemon and wait for it to exit (nothing when none answers)."""
        pid = self.pid()
        with contextlib.suppress(MpsError):
            await self.send(["quit"])
        if pid is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_gone(pid), COMMAND_TIMEOUT_S)

    def pid(self) -> int | None:
        """The daemon's pid while it runs."""
        try:
            path = os.path.join(self.plan.pipe_dir, PID_FILE)
            pid = int(read_text(path, limit=64, follow=False).strip())
            _check_running(pid)
        except (OSError, ValueError):
            return None
        return pid

    async def exited(self) -> None:
        """Return once the daemon exits: watched through its pid when its pid file is
        there, else probed every PROBE_S (a daemon that stops answering has exited)."""
        pid = self.pid()
        if pid is None:
            while True:
                await asyncio.sleep(PROBE_S)
                try:
                    await self.send(["get_server_list"])
                except MpsError:
                    return
        await _gone(pid)

    @property
    def _name(self) -> str:
        return os.path.basename(self._binary[-1])

    async def _run(self, args: list[str], stdin: str) -> tuple[int, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._binary, *args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=self._env,
            )  # fmt: skip
        except OSError as exc:
            raise MpsError(f"cannot run {' '.join(self._binary)}: {exc.strerror}") from None
        try:
            out, _ = await asyncio.wait_for(proc.communicate(stdin.encode()), COMMAND_TIMEOUT_S)
        except TimeoutError:
            await _kill(proc)
            raise MpsError(f"{self._name} did not answer within {COMMAND_TIMEOUT_S:g}s") from None
        except BaseException:  # the agent stops: the command is not left on the host
            await asyncio.shield(_kill(proc))
            raise
        return proc.returncode or 0, out.decode(errors="replace")


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()


async def _gone(pid: int) -> None:
    """Return once process `pid` has exited (reaped here when it is our child)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop, gone = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(fd, gone.set)
    try:
        await gone.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks


def _check_running(pid: int) -> None:
    """OSError unless `pid` runs: a zombie (exited, not yet reaped by its parent) does not."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        raise ProcessLookupError(pid)
