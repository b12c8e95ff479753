"""Upgrade gap: how long allocatable is 0 across an agent upgrade, in the kubelet
stand-in (which replaces a plugin as the kubelet does: any stream that ends marks
the resource unhealthy until a plugin registers again and sends its list).

Value: the successor started beside the old agent (DaemonSet maxSurge) and waiting
for the device-plugin directory, the old one then SIGTERMed. Baseline, in the same
trial: the default DaemonSet update, the old agent SIGTERMed and its successor
started once it exited. Both are `gpuslice run --fake-hardware t4x4` processes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.harness import MS, Figure, Target
from bench.plan import Plan
from bench.rigs import GPU, scratch
from bench.runtime_env import runtime_env
from gpuslice.testing.kubelet import KubeletStandin

FIGURES = ("upgrade_gap",)
TIMEOUT_S = 30.0
_BIN = Path(sys.executable).parent / "gpuslice"
AGENT = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "gpuslice"]


class Agent:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[bytes] = []
        self.waiting = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            self.lines.append(line)
            if b"plugin_dir_locked_waiting" in line:
                self.waiting.set()

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), TIMEOUT_S)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        await self._reader


async def start_agent(
    plugins: str, command: Sequence[str] = AGENT, env: Mapping[str, str] | None = None
) -> Agent:
    """`gpuslice run --fake-hardware t4x4` (by `command`) on the directory `plugins`."""
    args = ["run", "--fake-hardware", "t4x4"]
    args += ["--kubelet-socket", os.path.join(plugins, "kubelet.sock")]
    proc = await asyncio.create_subprocess_exec(
        *command,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env or runtime_env()),
    )
    return Agent(proc)


async def upgrade_gap(surge: bool) -> float:
    """Seconds allocatable was 0 across one upgrade (with a successor beside, or not)."""
    with scratch() as work:
        plugins = os.path.join(work, "plugins")
        os.mkdir(plugins)
        async with KubeletStandin(plugins) as kubelet:
            old = await start_agent(plugins)
            new: Agent | None = None
            try:
                await kubelet.wait_for(lambda k: k.serves({GPU: 4}), TIMEOUT_S)
                if surge:
                    new = await start_agent(plugins)
                    await asyncio.wait_for(new.waiting.wait(), TIMEOUT_S)
                await old.stop()
                if new is None:
                    new = await start_agent(plugins)
                await kubelet.wait_for(
                    lambda k: k.serves({GPU: 4}) and k.endpoint(GPU) is not None, TIMEOUT_S
                )
                return kubelet.unserved_s(GPU)
            finally:
                await old.stop()
                if new is not None:
                    await new.stop()


async def run(plan: Plan) -> list[Figure]:
    values: list[float] = []
    base: list[float] = []
    for _ in range(plan.starts):
        base.append(await upgrade_gap(surge=False) * 1000)
        values.append(await upgrade_gap(surge=True) * 1000)
    return [
        Figure(
            "upgrade_gap",
            "allocatable 0 across an upgrade: successor beside the old agent (t4x4)",
            MS,
            values,
            (Target(50), Target(0.1, "ratio")),
            base,
            "successor started once the old agent exited (default DaemonSet update)",
        )
    ]
