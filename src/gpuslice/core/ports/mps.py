"""Ports: The MPS control daemons: how they are launched and commanded."""

from __future__ import annotations

from typing import Protocol

from gpuslice.core.errors import GpusliceError
from gpuslice.core.mps import DaemonPlan, RunningDaemon


class MpsError(GpusliceError):
    """An MPS control daemon could not be started or did not answer."""


class MpsHostAbsent(MpsError):  # noqa: N818 - reads as what happened
    """`gpuslice mps-control` does not answer (not started yet, or restarting)."""


class MpsLauncher(Protocol):
    """Where MPS control daemons are started and watched (adapters.mps: from this
    process, or from `gpuslice mps-control`). Each method raises MpsError."""

    async def start(self, plan: DaemonPlan) -> RunningDaemon:
        """Start the daemon of `plan` (no limits set yet)."""
        ...

    async def running(self, root: str) -> RunningDaemon | None:
        """The daemon running in the resource directory `root`, if any."""
        ...

    async def found(self, mps_root: str) -> tuple[RunningDaemon, ...]:
        """Every daemon running under `mps_root`."""
        ...

    async def exited(self, daemon: RunningDaemon) -> None:
        """Return once `daemon` exits (or can no longer be watched: look again)."""
        ...


class MpsCommands(Protocol):
    """Commands to the running daemon of a plan (adapters.mps.ControlCommands)."""

    async def limit(self, plan: DaemonPlan) -> None:
        """Give the daemon's new clients `plan`'s limits, read back; MpsError otherwise."""
        ...

    async def clients(self, plan: DaemonPlan) -> int:
        """How many clients its servers have now."""
        ...

    async def quit(self, plan: DaemonPlan) -> None:
        """Ask it to end (it waits for its clients)."""
        ...
