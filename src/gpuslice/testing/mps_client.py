"""A simulated CUDA program under MPS: it connects to the control daemon of
CUDA_MPS_PIPE_DIRECTORY (gpuslice.testing.mps_control), prints the limits its server
gave it as one JSON line, runs until its stdin closes (it leaves, exit 0) or until its
server goes away (a CUDA error: one line on stderr, exit 1). Refused (a quitting
daemon) or without a daemon, it exits 2. Run as `python -m gpuslice.testing.mps_client`;
SimulatedClient starts one from a test and drives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import sys
from collections.abc import Mapping
from typing import Any

from gpuslice.testing.mps_control import CONTROL

LOST = 1
REFUSED = 2


def main() -> int:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(pipe, CONTROL))
        sock.sendall(f"client {os.getpid()} {os.getuid()}\n".encode())
        reply = sock.makefile("rb").readline().decode(errors="replace")
    except OSError as exc:
        print(f"cannot reach the MPS control daemon: {exc.strerror}", file=sys.stderr)
        return REFUSED
    if not reply.startswith("ok "):
        print(reply.strip() or "refused by the MPS control daemon", file=sys.stderr)
        return REFUSED
    print(reply.removeprefix("ok ").strip(), flush=True)
    while True:
        ready, _, _ = select.select([sys.stdin, sock], [], [])
        if sock in ready and not sock.recv(1):
            print("CUDA error: the MPS server went away", file=sys.stderr)
            return LOST
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            sock.close()
            return 0


class SimulatedClient:
    """One client process on the daemon of `pipe`: `limits` once it connected."""

    def __init__(self, proc: asyncio.subprocess.Process, limits: dict[str, Any]) -> None:
        self.proc = proc
        self.limits = limits

    @classmethod
    async def connect(cls, pipe: str, env: Mapping[str, str] | None = None) -> SimulatedClient:
        """Start a client on `pipe`; raises RuntimeError when it was not served."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gpuslice.testing.mps_client",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **(env or {}), "CUDA_MPS_PIPE_DIRECTORY": pipe},
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stderr is not None
        line = await proc.stdout.readline()
        if not line:
            error = (await proc.stderr.read()).decode(errors="replace").strip()
            await proc.wait()
            raise RuntimeError(f"client not served (status {proc.returncode}): {error}")
        return cls(proc, json.loads(line))

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def leave(self) -> int:
        """End the program normally; its exit status."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        return await self.proc.wait()

    async def ended(self) -> tuple[int, str]:
        """Wait for it to end on its own; its exit status and stderr."""
        assert self.proc.stderr is not None
        error = (await self.proc.stderr.read()).decode(errors="replace").strip()
        return await self.proc.wait(), error

    def kill(self) -> None:
        if self.running:
            self.proc.kill()


if __name__ == "__main__":
    sys.exit(main())
