"""The MPS control daemon: its process and the commands piped to it."""

from gpuslice.adapters.mps.daemon import ControlDaemon
from gpuslice.core.ports import MpsError

__all__ = ["ControlDaemon", "MpsError"]
