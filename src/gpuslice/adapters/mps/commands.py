"""Commands to a running MPS control daemon, piped to `<binary>` with the daemon's
pipe directory in its env, as upstream and the MPS docs do."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence

from gpuslice.core.mps import DaemonPlan, pids, server_commands
from gpuslice.core.ports import MpsError

COMMAND_TIMEOUT_S = 10.0


class ControlCommands:
    def __init__(self, binary: Sequence[str]) -> None:
        self._binary = tuple(binary)

    @property
    def name(self) -> str:
        return os.path.basename(self._binary[-1])

    async def limit(self, plan: DaemonPlan) -> None:
        """Give new clients `plan`'s limits: the daemon's defaults (servers started from
        now on) and each running server's (its clients from now on); read back."""
        servers = pids(await self.send(plan, ["get_server_list"]))
        if await self._wrong(plan):
            await self.send(plan, plan.set_commands())
        for server in servers:
            await self.send(plan, server_commands(plan, server))
        wrong = await self._wrong(plan)
        if wrong:
            raise MpsError(
                f"the MPS daemon of {plan.resource} kept other limits: {'; '.join(wrong)}"
            )

    async def _wrong(self, plan: DaemonPlan) -> list[str]:
        pinned = [
            await self.send(plan, [f"get_default_device_pinned_mem_limit {i}"])
            for i in range(len(plan.gpu_uuids))
        ]
        threads = await self.send(plan, ["get_default_active_thread_percentage"])
        return plan.mismatches(pinned, threads)

    async def clients(self, plan: DaemonPlan) -> int:
        """How many clients the daemon's servers have now."""
        count = 0
        for server in pids(await self.send(plan, ["get_server_list"])):
            count += len(pids(await self.send(plan, [f"get_client_list {server}"])))
        return count

    async def quit(self, plan: DaemonPlan) -> None:
        """Ask the daemon to end. The real `quit` refuses new clients and waits for the
        connected ones to leave; a quit that does not return in time is left to finish
        on its own (the daemon is never killed)."""
        await self.send(plan, ["quit"])

    async def send(self, plan: DaemonPlan, commands: Sequence[str]) -> str:
        """Pipe `commands` to the daemon of `plan`; its answer. Raises MpsError."""
        code, out = await run(self._binary, [], plan.env, "".join(f"{c}\n" for c in commands))
        if code != 0:
            raise MpsError(f"{self.name} {commands[0]!r} exited with status {code}: {out.strip()}")
        return out.strip()


async def run(
    binary: Sequence[str], args: Sequence[str], env: dict[str, str], stdin: str
) -> tuple[int, str]:
    """Run `binary args` with `stdin`; its status and output. Raises MpsError when it
    cannot run or does not end within COMMAND_TIMEOUT_S (it is then killed: only this
    command process, never a daemon)."""
    name = os.path.basename(binary[-1])
    try:
        proc = await asyncio.create_subprocess_exec(
            *binary, *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env={**os.environ, **env},
        )  # fmt: skip
    except OSError as exc:
        raise MpsError(f"cannot run {' '.join(binary)}: {exc.strerror}") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode()), COMMAND_TIMEOUT_S)
    except TimeoutError:
        await _kill(proc)
        raise MpsError(f"{name} did not answer within {COMMAND_TIMEOUT_S:g}s") from None
    except BaseException:  # the agent stops: the command is not left on the host
        await asyncio.shield(_kill(proc))
        raise
    return proc.returncode or 0, out.decode(errors="replace")


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()
