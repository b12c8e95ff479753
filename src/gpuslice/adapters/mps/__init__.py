"""MPS control daemons: started from this process (LocalLauncher) or from
`gpuslice mps-control` (MpsHost, RemoteLauncher), and driven with commands piped to
the control binary (ControlCommands)."""

from gpuslice.adapters.mps.commands import ControlCommands
from gpuslice.adapters.mps.host import MpsHost, RemoteLauncher
from gpuslice.adapters.mps.local import LocalLauncher
from gpuslice.core.ports import MpsError

__all__ = ["ControlCommands", "LocalLauncher", "MpsError", "MpsHost", "RemoteLauncher"]
