"""Injected health events: a JSON-lines file followed from another process.

Each complete line is one event about one GPU (by index or UUID):
{"gpu": 0, "xid": 79}, {"gpu": "GPU-...", "xid": 48}, {"gpu": 0, "lost": true},
{"gpu": 0, "recovered": true}, and MIG-scoped {"gpu": 0, "mig": 1, "xid": 31}
(the parent's MIG device at that index). Lines with "process" or "process_exit"
change the simulated processes, and {"allocate": {"pid": 4242, "memory_mib": 512}} makes
one allocate more (refused past its pod's hard limit; fake.processes);
{"mig_fault": {"gpu": 0, "call": "create", "error": "INSUFFICIENT_RESOURCES"}} fails the
GPU's next MIG call of that kind (fake.mig). A line without its newline yet is left for a
later read.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import structlog

from gpuslice.adapters.fake.mig import MigFault, parse_mig_fault
from gpuslice.adapters.fake.processes import (
    Allocation,
    ProcessExit,
    SimProcess,
    find_gpu,
    parse_allocate,
    parse_process,
)
from gpuslice.core.devices import Gpu, HardwareSnapshot, HealthEvent

_log = structlog.get_logger()

MAX_LINE = 64 << 10  # an event line is a few dozen bytes
MAX_READ = 1 << 20
HEAD_BYTES = 256
MAX_DEPTH = 8  # the deepest event line: {"process": {...}} with lists inside
EVENT_KEYS = frozenset({"gpu", "xid", "lost", "recovered", "mig"})
KINDS = ("xid", "lost", "recovered")


class EventFile:
    """Reads the complete lines appended to a file since the last read.

    The file may not exist yet. It is kept open between reads (one descriptor for the
    reader's life, from its creation when the file exists then): when it is renamed away
    (rotated), what was appended to it before the rename is read first, then the new
    file from its beginning; when it is truncated (shorter than what was read, or its
    first bytes changed: truncated and rewritten longer) it is read again from its
    beginning. A line is at most MAX_LINE bytes: a longer one is returned cut to
    MAX_LINE + 1 bytes (parse_event refuses it) and the rest of it skipped, so memory
    stays bounded whatever the file holds. At most MAX_READ bytes are read per call.
    A FIFO or device there is refused with one log line, never read.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._offset = 0
        self._head = b""  # the file's first bytes as read: a rewrite changes them
        self._partial = b""
        self._skipping = False  # inside a line longer than MAX_LINE
        self._refused: str | None = None
        self.line_number = 0  # of the last complete line read
        if self.path.exists():  # held from the start: rotation is followed from there
            self._open()

    def new_lines(self) -> list[tuple[int, bytes]]:
        """(line number, line) for each complete line not yet returned."""
        out: list[tuple[int, bytes]] = []
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if self._fd is not None:
            held = os.fstat(self._fd)
            if st is None or (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):
                self._read(out)  # the tail written before the rename
                self._close()
            elif held.st_size < self._offset or self._rewritten():
                self._close()
        if self._fd is None and st is not None and not self._open():
            return out
        if self._fd is not None:
            self._read(out)
        return out

    def close(self) -> None:
        self._close()

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            return False
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            self._refuse("not a regular file (a FIFO or device?); events are not read")
            return False
        self._refuse(None)
        self._fd, self._offset, self._head = fd, 0, b""
        self._partial, self._skipping, self.line_number = b"", False, 0
        return True

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _rewritten(self) -> bool:
        assert self._fd is not None
        return bool(self._head) and os.pread(self._fd, len(self._head), 0) != self._head

    def _read(self, out: list[tuple[int, bytes]]) -> None:
        assert self._fd is not None
        try:
            chunk = os.pread(self._fd, MAX_READ, self._offset)
        except OSError:
            return
        if len(self._head) < HEAD_BYTES and self._offset < HEAD_BYTES:
            self._head = (self._head + chunk)[:HEAD_BYTES]
        self._offset += len(chunk)
        *lines, rest = chunk.split(b"\n")
        for line in lines:
            if self._skipping:  # the end of a line already returned cut
                self._skipping = False
                continue
            whole, self._partial = self._partial + line, b""
            self.line_number += 1
            out.append((self.line_number, whole[: MAX_LINE + 1]))
        if self._skipping:
            return
        self._partial += rest
        if len(self._partial) > MAX_LINE:  # returned cut now; the rest is skipped
            self.line_number += 1
            out.append((self.line_number, self._partial[: MAX_LINE + 1]))
            self._partial, self._skipping = b"", True

    def _refuse(self, problem: str | None) -> None:
        if problem is not None and problem != self._refused:
            _log.warning("fake_events_file_refused", file=str(self.path), problem=problem)
        self._refused = problem


def parse_event(
    line: bytes, snapshot: HardwareSnapshot
) -> HealthEvent | SimProcess | ProcessExit | Allocation | MigFault | None:
    """One line -> an event or a process change; None for a blank line. ValueError
    says what is wrong."""
    if len(line) > MAX_LINE:
        raise ValueError(f"longer than {MAX_LINE} bytes")
    if _depth(line) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    try:
        text = line.decode("utf-8").strip()
        data = json.loads(text) if text else None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError("not a JSON object") from None
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if "process" in data or "process_exit" in data:
        return _process_change(data, snapshot)
    if "mig_fault" in data:
        if len(data) != 1:
            raise ValueError('"mig_fault" lines have no other key')
        return parse_mig_fault(data["mig_fault"], snapshot)
    if "allocate" in data:
        if len(data) != 1:
            raise ValueError('"allocate" lines have no other key')
        return parse_allocate(data["allocate"])
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


def _depth(line: bytes) -> int:
    """How deep the brackets of `line` nest (counted in strings too: an upper bound)."""
    depth = deepest = 0
    for byte in line:
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


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
