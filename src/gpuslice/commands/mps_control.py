"""`gpuslice mps-control`: the process MPS control daemons are started from, run in a
pod of its own (the chart's mps-control DaemonSet) so that the daemons and their
clients outlive every restart and upgrade of the agent. It serves the agent on a unix
socket under the MPS root (adapters.mps.host) until SIGTERM; the daemons it started
keep running until their pod ends."""

from __future__ import annotations

import asyncio
import os

from gpuslice.config.checks import show
from gpuslice.config.options import RunOptions
from gpuslice.core.errors import ConfigError

SOCKET_NAME = ".mps-control.sock"  # a leading dot: never a resource domain under the root
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with its NUL


async def run_mps_control(
    opts: RunOptions, stop: asyncio.Event, *, simulated: bool = False
) -> None:
    """Serve until `stop` (wiring.mps_control composes it, loading no more of the agent,
    so this process stays small). Raises ConfigError (one line) when the root or the
    socket cannot be used."""
    root = opts.mps.root
    if not root or not os.path.isabs(root):
        raise ConfigError(
            f"--mps-root (MPS_ROOT): got {show(root)}; expected the absolute host directory "
            "of the MPS daemons, as the agent's mpsRoot (NVIDIA's Helm chart uses "
            "/run/nvidia/mps)"
        )
    socket = opts.mps.control_socket or os.path.join(root, SOCKET_NAME)
    where = "--mps-control-socket (GPUSLICE_MPS_CONTROL_SOCKET)"
    if len(os.fsencode(socket)) > SOCKET_PATH_MAX:
        raise ConfigError(
            f"{where}: got {show(socket)}; expected a path of at most {SOCKET_PATH_MAX} bytes "
            "(a unix socket's limit)"
        )
    from gpuslice.wiring.mps_control import serve_mps_control

    try:
        os.makedirs(root, mode=0o755, exist_ok=True)
    except OSError as exc:
        why = exc.strerror
        raise ConfigError(f"--mps-root (MPS_ROOT): cannot create {show(root)}: {why}") from None
    try:
        await serve_mps_control(opts.mps.control_binary, root, socket, stop, simulated=simulated)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot serve on {show(socket)}: {exc.strerror}") from None
