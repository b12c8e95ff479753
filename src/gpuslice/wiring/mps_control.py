"""`gpuslice mps-control`'s composition: the MPS host serving the agent on a unix socket,
launching the control binary (the testing kit's with --simulated). Only the MPS adapter
is loaded, so that this process, which runs on every MPS node as long as its daemons,
stays small."""

from __future__ import annotations

import asyncio

from gpuslice.adapters.hosts.simulated import SIMULATED_MPS_CONTROL
from gpuslice.adapters.mps import LocalLauncher, MpsHost


async def serve_mps_control(
    binary: str, root: str, socket: str, stop: asyncio.Event, *, simulated: bool
) -> None:
    """Serve until `stop`. Raises OSError when the socket cannot be served."""
    launcher = LocalLauncher(list(SIMULATED_MPS_CONTROL) if simulated else [binary])
    await MpsHost(launcher, root).serve(socket, stop)
