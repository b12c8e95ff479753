"""The invariant every hostile input must leave intact, and a `gpuslice run` process
to attack.

After any bad input the agent stays up, keeps serving the last good state (the kubelet
stand-in streams the same resources and device counts), answers an Allocate within
ALLOCATE_WITHIN_S, and its resident memory has grown by less than RSS_GROWTH_LIMIT
since the baseline. `Invariant.check()` asserts all four; any test of outside input
(config text, files, API answers, gRPC or HTTP requests, signals) can use it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.config.flags import FLAGS
from gpuslice.testing.kubelet import KubeletStandin

ALLOCATE_WITHIN_S = 1.0
RSS_GROWTH_LIMIT = 64 << 20
READY_WITHIN_S = 20.0
_BIN = Path(sys.executable).parent / "gpuslice"
GPUSLICE = str(_BIN) if _BIN.exists() else (shutil.which("gpuslice") or "gpuslice")


def short_dir() -> str:
    """A fresh directory under /tmp (unix socket paths must stay short)."""
    return tempfile.mkdtemp(prefix="gsh-", dir="/tmp")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any variable the agent reads as a flag."""
    flag_vars = {var for flag in FLAGS for var in flag.env} | {"NODE_NAME"}
    env = {k: v for k, v in os.environ.items() if k not in flag_vars}
    env.update(extra)
    return env


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@dataclass
class AgentUnderAttack:
    """`gpuslice run` on simulated hardware against the kubelet stand-in of `plugin_dir`,
    its stderr log collected line by line."""

    proc: asyncio.subprocess.Process
    plugin_dir: str
    lines: list[str] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @classmethod
    async def start(
        cls, plugin_dir: str, *args: str, hardware: str = "t4", env: dict[str, str] | None = None
    ) -> AgentUnderAttack:
        argv = [
            GPUSLICE, "run", "--fake-hardware", hardware,
            "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock"),
            "--cdi-spec-dir", os.path.join(plugin_dir, "cdi"),
            "--pod-resources-socket", os.path.join(plugin_dir, "pr", "kubelet.sock"),
            "--fake-events", os.path.join(plugin_dir, "events.jsonl"),
            *args,
        ]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env or clean_env(),
        )
        agent = cls(proc, plugin_dir)
        agent._reader = asyncio.create_task(agent._read())
        return agent

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            async with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def count(self, text: str) -> int:
        return sum(1 for line in self.lines if text in line)

    async def wait_for_lines(self, text: str, count: int = 1, timeout_s: float = 15.0) -> str:
        """The last of the first `count` log lines containing `text`."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self.count(text) >= count or not self.alive),
                timeout_s,
            )
        found = [line for line in self.lines if text in line]
        assert len(found) >= count, f"{text!r} logged {len(found)} times:\n" + self.log
        return found[count - 1]

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)

    async def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM and the exit status (it must exit within `timeout_s`)."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(self.proc.wait(), timeout_s)
        if self._reader is not None:
            await self._reader
        return rc

    async def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await self._reader

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Invariant:
    """What a hostile input must not change: taken once the agent serves."""

    agent: AgentUnderAttack
    kubelet: KubeletStandin
    served: dict[str, int]
    rss: int

    @classmethod
    async def baseline(
        cls, agent: AgentUnderAttack, kubelet: KubeletStandin, served: dict[str, int]
    ) -> Invariant:
        """Wait until the stand-in streams `served`, then note the agent's memory."""
        await kubelet.wait_for(lambda k: k.serves(served) or not agent.alive, READY_WITHIN_S)
        assert agent.alive, "the agent stopped before serving:\n" + agent.log
        return cls(agent, kubelet, dict(served), rss_bytes(agent.proc.pid))

    async def check(self, devices: Sequence[str] | None = None) -> None:
        """The agent is up, serves what it served, answers Allocate within
        ALLOCATE_WITHIN_S, and has grown by less than RSS_GROWTH_LIMIT."""
        assert self.agent.alive, "the agent stopped:\n" + self.agent.log
        assert self.kubelet.serves(self.served), self.kubelet.node_status()
        resource = next(iter(self.served))
        ids = list(devices or [next(iter(self.kubelet.devices(resource)))])
        await asyncio.wait_for(self.kubelet.allocate(resource, [ids]), ALLOCATE_WITHIN_S)
        grown = rss_bytes(self.agent.proc.pid) - self.rss
        assert grown < RSS_GROWTH_LIMIT, f"RSS grew by {grown >> 20} MiB"
