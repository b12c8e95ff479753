"""The `gpuslice` command as a real process: one-shot runs and a long-running agent
whose stderr log is followed line by line."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuslice.config.flags import FLAGS

_BIN = Path(sys.executable).parent / "gpuslice"
GPUSLICE = str(_BIN) if _BIN.exists() else (shutil.which("gpuslice") or "gpuslice")
EXIT_TIMEOUT_S = 10.0


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any variable the agent reads as a flag."""
    flag_vars = {var for flag in FLAGS for var in flag.env} | {"NODE_NAME"}
    env = {k: v for k, v in os.environ.items() if k not in flag_vars}
    env.update(extra)
    return env


def run_once(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command that ends by itself."""
    return subprocess.run(
        [GPUSLICE, *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=30,
        check=False,
    )


class AgentProcess:
    """`gpuslice run ...` with its stderr log collected as it is written."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._eof = False
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, args: Sequence[str], env: dict[str, str] | None = None) -> AgentProcess:
        proc = await asyncio.create_subprocess_exec(
            GPUSLICE,
            "run",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env or clean_env(),
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            async with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        async with self._changed:
            self._eof = True
            self._changed.notify_all()

    async def wait_for_line(self, text: str, timeout_s: float = 10.0) -> str:
        """The first log line containing `text`; fails if the process ends first."""

        def found() -> bool:
            return self._eof or any(text in line for line in self.lines)

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(found), timeout_s)
        match = [line for line in self.lines if text in line]
        assert match, f"process ended without logging {text!r}: {self.log}"
        return match[0]

    async def wait_for_lines(self, text: str, count: int, timeout_s: float = 10.0) -> None:
        """Until `count` log lines contain `text`; fails if the process ends first."""

        def seen() -> int:
            return sum(1 for line in self.lines if text in line)

        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self._eof or seen() >= count), timeout_s
            )
        assert seen() >= count, f"{seen()} lines with {text!r}, not {count}: {self.log}"

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)

    async def wait(self, timeout_s: float = EXIT_TIMEOUT_S) -> tuple[int, float]:
        """(exit status, seconds it took to exit)."""
        started = time.monotonic()
        rc = await asyncio.wait_for(self.proc.wait(), timeout_s)
        await self._reader
        return rc, time.monotonic() - started

    async def kill(self) -> None:
        """Make sure the process is gone (test teardown)."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await self._reader

    @property
    def log(self) -> str:
        return "\n".join(self.lines)


async def http_json(port: int, path: str, timeout_s: float = 10.0) -> tuple[int, Any]:
    """GET `path` from an agent's status port on loopback: the status code and the JSON."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)
