"""`gpuslice run` as a real process against a kubelet stand-in in this process.

The agent runs `--fake-hardware dgx-a100` with 48 time-slicing replicas per GPU, in the
environment of bench.runtime_env; its log is read as it comes and the tail kept for
errors. Also: short-lived reference interpreters in the same environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

from bench.harness import now
from bench.rigs import GPU, time_slicing
from bench.runtime_env import runtime_env
from gpuslice.testing.kubelet import KubeletStandin

REPLICAS = 48
START_TIMEOUT_S = 30.0
_BIN = Path(sys.executable).parent / "gpuslice"
AGENT = [str(_BIN)] if _BIN.exists() else [sys.executable, "-m", "gpuslice"]
READY = "print('ready', flush=True)"


@contextlib.asynccontextmanager
async def agent_process(
    work: str, src: str | None = None
) -> AsyncIterator[tuple[asyncio.subprocess.Process, KubeletStandin, float]]:
    """(process, stand-in, seconds from spawn until every resource registered); with
    `src`, the gpuslice package is imported from that source tree instead."""
    config = time_slicing(os.path.join(work, "ts.yaml"), REPLICAS)
    plugins = os.path.join(work, "plugins")
    os.mkdir(plugins)
    args = ["run", "--fake-hardware", "dgx-a100", "--config-file", config]
    args += ["--kubelet-socket", os.path.join(plugins, "kubelet.sock")]
    env = runtime_env()
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], src))
    async with KubeletStandin(plugins) as kubelet:
        t0 = now()
        proc = await asyncio.create_subprocess_exec(
            *AGENT,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        log: deque[bytes] = deque(maxlen=10)
        drain = asyncio.create_task(_keep_tail(proc, log))
        try:
            registered = asyncio.create_task(
                kubelet.wait_for(lambda k: GPU in k.resources(), START_TIMEOUT_S)
            )
            ended = asyncio.create_task(proc.wait())
            await asyncio.wait({registered, ended}, return_when=asyncio.FIRST_COMPLETED)
            elapsed = now() - t0
            if not registered.done():
                registered.cancel()
                await drain
                tail = b"".join(log).decode(errors="replace")
                raise RuntimeError(
                    f"agent exited with {proc.returncode} before registering: {tail}"
                )
            ended.cancel()
            registered.result()
            yield proc, kubelet, elapsed
        finally:
            await _stop(proc)
            await drain


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def _keep_tail(proc: asyncio.subprocess.Process, tail: deque[bytes]) -> None:
    """Read the agent's log as it comes (so the pipe never fills), keeping the last lines."""
    assert proc.stderr is not None
    async for line in proc.stderr:
        tail.append(line)


async def run_to_exit(code: str) -> float:
    """Seconds from spawning `python -c code` until it exits."""
    env = runtime_env()
    t0 = now()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, env=env)
    if await proc.wait() != 0:
        raise RuntimeError(f"python -c {code!r} failed")
    return now() - t0


@contextlib.asynccontextmanager
async def interpreter(code: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, float]]:
    """`python -c code` until it prints `ready`: (process, seconds from spawn to that
    line). The process waits for its stdin to close, which happens on exit."""
    env = runtime_env()
    t0 = now()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"{code}\n{READY}\nimport sys\nsys.stdin.read()\n",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        if line.strip() != b"ready":
            raise RuntimeError(f"python -c {code!r} failed before getting ready")
        yield proc, now() - t0
    finally:
        proc.stdin.close()
        await proc.wait()


def vmrss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")
