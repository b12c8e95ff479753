"""The simulated GPUs' compute-policy time slice: what the DRA driver sets for a claim's
TimeSlicing interval, kept where `inspect` reads it.

With an events file (the simulated node's channel to the outside), the settings live in
`<events file>.timeslices.json` beside it, so another process (`gpuslice inspect`) sees
what the agent set; without one, in memory.
"""

from __future__ import annotations

import json
import os
import threading

from gpuslice.adapters.outside_files import read_bytes, replace_atomically
from gpuslice.core.errors import BackendError
from gpuslice.core.strategies.time_slicing import INTERVALS

MAX_BYTES = 64 * 1024


class FakeTimeSlices:
    """The TimeSlicer port on simulated GPUs."""

    def __init__(self, events_path: str | os.PathLike[str] | None = None) -> None:
        self.path = f"{os.fspath(events_path)}.timeslices.json" if events_path else None
        self._set: dict[str, str] = {}
        self._lock = threading.Lock()

    def set_time_slice(self, gpu_uuid: str, interval: str) -> None:
        if interval not in INTERVALS:
            raise BackendError(f"time slice {interval!r}: not one of {', '.join(INTERVALS)}")
        with self._lock:
            current = self._read()
            current[gpu_uuid] = interval
            self._set = current
            if self.path is not None:
                try:
                    replace_atomically(self.path, json.dumps(current), 0o644)
                except OSError as exc:
                    raise BackendError(f"{self.path}: cannot write: {exc.strerror}") from None

    def time_slice(self, gpu_uuid: str) -> str | None:
        with self._lock:
            return self._read().get(gpu_uuid)

    def _read(self) -> dict[str, str]:
        if self.path is None:
            return dict(self._set)
        try:
            data = json.loads(read_bytes(self.path, limit=MAX_BYTES, follow=False))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): str(v) for k, v in data.items() if v in INTERVALS}
