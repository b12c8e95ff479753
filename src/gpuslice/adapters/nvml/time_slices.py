"""A real GPU's compute-policy time slice, set as NVIDIA's DRA driver sets it: with
`nvidia-smi compute-policy -i <uuid> --set-timeslice=<n>` (0 Default, 1 Short, 2 Medium,
3 Long). NVML's public API has no call for it. Needs the driver's nvidia-smi on the node
and the privileges the agent has; each call is bounded in time and its failure is one line.
"""

from __future__ import annotations

import subprocess
import threading

from gpuslice.core.errors import BackendError
from gpuslice.core.strategies.time_slicing import INTERVALS

TIMEOUT_S = 10.0
MAX_OUTPUT = 400


class NvidiaSmiTimeSlices:
    """The TimeSlicer port over nvidia-smi."""

    def __init__(self, binary: str = "nvidia-smi") -> None:
        self.binary = binary
        self._set: dict[str, str] = {}
        self._lock = threading.Lock()

    def set_time_slice(self, gpu_uuid: str, interval: str) -> None:
        if interval not in INTERVALS:
            raise BackendError(f"time slice {interval!r}: not one of {', '.join(INTERVALS)}")
        level = INTERVALS.index(interval)
        command = [self.binary, "compute-policy", "-i", gpu_uuid, f"--set-timeslice={level}"]
        try:
            done = subprocess.run(  # fixed arguments, no shell
                command, capture_output=True, timeout=TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"{' '.join(command)}: {exc}") from None
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).decode(errors="replace").split())
            raise BackendError(f"{' '.join(command)}: exit {done.returncode}: {said[:MAX_OUTPUT]}")
        with self._lock:
            self._set[gpu_uuid] = interval

    def time_slice(self, gpu_uuid: str) -> str | None:
        """What this agent set (nvidia-smi does not report the setting back)."""
        with self._lock:
            return self._set.get(gpu_uuid)
