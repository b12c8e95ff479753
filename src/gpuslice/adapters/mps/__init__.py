"""The MPS control daemon: its process and the commands piped to it."""

from gpuslice.adapters.mps.daemon import ControlDaemon, MpsError

__all__ = ["ControlDaemon", "MpsError"]
