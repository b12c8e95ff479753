"""`gpuslice mps-control`: the process MPS control daemons are started from, run in a
pod of its own (the chart's mps-control DaemonSet) so that the daemons and their
clients outlive every restart and upgrade of the agent. It serves the agent on a unix
socket under the MPS root (adapters.mps.host) until SIGTERM; the daemons it started
keep running until their pod ends."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from gpuslice.core.errors import ConfigError

SOCKET_NAME = ".mps-control.sock"  # a leading dot: never a resource domain under the root


async def run_mps_control(
    get: Callable[[str], str], stop: asyncio.Event, reload: asyncio.Event | None = None
) -> None:
    """Serve until `stop`. `get(flag)`: a setting (flag > env > default); no more of the
    agent's wiring is loaded, so this process stays small."""
    root = get("mps-root")
    if not root or not os.path.isabs(root):
        raise ConfigError(
            f"--mps-root (MPS_ROOT): got {root!r}; expected the absolute host directory of "
            "the MPS daemons, as the agent's mpsRoot (NVIDIA's Helm chart uses /run/nvidia/mps)"
        )
    from gpuslice.adapters.mps import LocalLauncher, MpsHost

    os.makedirs(root, mode=0o755, exist_ok=True)
    host = MpsHost(LocalLauncher([get("mps-control-binary")]), root)
    await host.serve(get("mps-control-socket") or os.path.join(root, SOCKET_NAME), stop)
