"""Injected health events: a JSON-lines file followed from another process.

Each complete line is one event about one GPU (by index or UUID):
{"gpu": 0, "xid": 79}, {"gpu": "GPU-...", "xid": 48}, {"gpu": 0, "lost": true},
{"gpu": 0, "recovered": true}, and MIG-scoped {"gpu": 0, "mig": 1, "xid": 31}
(the parent's MIG device at that index). Lines with "process" or "process_exit"
change the simulated processes (fake.processes). A line without its newline yet
is left for a later read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuslice.adapters.fake.processes import ProcessExit, SimProcess, find_gpu, parse_process
from gpuslice.core.devices import Gpu, HardwareSnapshot, HealthEvent

EVENT_KEYS = frozenset({"gpu", "xid", "lost", "recovered", "mig"})
KINDS = ("xid", "lost", "recovered")


class EventFile:
    """Reads the complete lines appended to a file since the last read.

    The file may not exist yet; if it is replaced or truncated, reading
    starts again from its beginning.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self.line_number = 0  # of the last complete line read

    def new_lines(self) -> list[tuple[int, bytes]]:
        """(line number, line) for each complete line not yet returned."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        identity = (st.st_dev, st.st_ino)
        if identity != self._identity or st.st_size < self._offset:
            self._identity, self._offset, self._partial = identity, 0, b""
            self.line_number = 0
        if st.st_size == self._offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        first = self.line_number + 1
        self.line_number += len(lines)
        return list(enumerate(lines, first))


def parse_event(
    line: bytes, snapshot: HardwareSnapshot
) -> HealthEvent | SimProcess | ProcessExit | None:
    """One line -> an event or a process change; None for a blank line. ValueError
    says what is wrong."""
    try:
        text = line.decode("utf-8").strip()
        data = json.loads(text) if text else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("not a JSON object") from None
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if "process" in data or "process_exit" in data:
        return _process_change(data, snapshot)
    unknown = sorted(set(data) - EVENT_KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(EVENT_KEYS))})")
    gpu = find_gpu(data.get("gpu"), snapshot)
    kinds = [k for k in KINDS if k in data]
    if len(kinds) != 1:
        raise ValueError('needs exactly one of "xid", "lost": true, "recovered": true')
    kind = kinds[0]
    if kind != "xid":
        if data[kind] is not True or "mig" in data:
            raise ValueError(f'"{kind}" takes only true and no "mig"')
        return HealthEvent(gpu_uuid=gpu.uuid, kind=kind)
    xid = data["xid"]
    if isinstance(xid, bool) or not isinstance(xid, int) or xid <= 0:
        raise ValueError(f'"xid" must be a positive integer, got {xid!r}')
    return HealthEvent(gpu_uuid=gpu.uuid, kind="xid", xid=xid, detail=_mig_detail(data, gpu))


def _mig_detail(data: dict[str, object], gpu: Gpu) -> str:
    if "mig" not in data:
        return ""
    index = data["mig"]
    mig = next((m for m in gpu.mig_devices if m.index == index), None)
    if isinstance(index, bool) or mig is None:
        raise ValueError(f"GPU {gpu.index} has no MIG device {index!r}")
    return f"gi={mig.gi} ci={mig.ci}"


def _process_change(
    data: dict[str, object], snapshot: HardwareSnapshot
) -> SimProcess | ProcessExit:
    if len(data) != 1:
        raise ValueError('"process" and "process_exit" lines have no other key')
    if "process_exit" in data:
        pid = data["process_exit"]
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f'"process_exit" must be a positive pid, got {pid!r}')
        return ProcessExit(pid)
    body = data["process"]
    if not isinstance(body, dict):
        raise ValueError('"process" must be an object')
    return parse_process(body, snapshot)
