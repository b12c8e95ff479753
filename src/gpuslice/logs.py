"""Log setup: every line is an event name plus key=value fields (or JSON).

In JSON mode every line the process writes to stderr is a JSON event: gRPC C-core and
Python itself (warnings, a thread's traceback) write to file descriptor 2 directly, so
capture_stderr() makes it a pipe whose lines one thread logs as events, and the log
itself goes to the real stderr.

Logging never stops work: a line that cannot be written (the reader of the log pipe
gone, a closed stream) is dropped (LineSink), never raised into the code that logged
it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import TextIO, cast

import structlog

LEVELS = ("debug", "info", "warning", "error")
# gRPC C-core (absl) lines: "E1125 09:10:16.931181   12345 chttp2_server.cc:1234] text"
_GRPC_LINE = re.compile(r"([DIWEF])\d{4} [0-9:.]+ +\d+ ([^\]\s]+)\] ?(.*)")
_GRPC_LEVEL = {"D": "debug", "I": "info", "W": "warning", "E": "error", "F": "error"}
_json = False


def setup(
    level: str = "info",
    fmt: str = "text",
    stream: TextIO | None = None,
    bound: Mapping[str, str] | None = None,
) -> None:
    """Configure structlog once per process; `bound` fields (node=...) go on every line."""
    global _json
    _json = fmt == "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.processors.KeyValueRenderer(
            key_order=["timestamp", "level", "event"], drop_missing=True
        )
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(cast(TextIO, LineSink(stream or sys.stderr))),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    if bound:
        bind(**bound)


class LineSink:
    """The stream log lines go to, written a whole line at a time (to its file descriptor
    when it has one); a line that cannot be written (EPIPE, EAGAIN, a closed stream) is
    dropped: there is nowhere left to say so."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        try:
            self._fd: int | None = stream.fileno()
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation, closed
            self._fd = None
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        if "\n" in text:
            line, self._pending = "".join(self._pending), []
            with contextlib.suppress(OSError, ValueError):
                self._write(line)
        return len(text)

    def _write(self, line: str) -> None:
        if self._fd is None:
            self._stream.write(line)
            self._stream.flush()
            return
        data = line.encode("utf-8", "backslashreplace")
        while data:
            data = data[os.write(self._fd, data) :]

    def flush(self) -> None:
        """Lines are written as they end; nothing waits here."""


def bind(**fields: str) -> None:
    """Put these fields on every later line of this thread."""
    structlog.contextvars.bind_contextvars(**fields)


def json_mode() -> bool:
    return _json


def final_error(text: str, code: int) -> None:
    """The JSON form of the command's last line, `gpuslice: error: ...`, written after
    whatever stderr lines are still in the pipe."""
    if _pump is not None:
        _pump.drain()
    structlog.get_logger("gpuslice").error("exit_on_error", error=text, exit_code=code)


def capture_stderr() -> TextIO:
    """Route file descriptor 2 through a pipe whose lines become JSON events; returns a
    stream on the real stderr for the log. Once per process."""
    global _pump
    if _pump is None:
        _pump = _StderrPump()
    return _pump.real


class _StderrPump:
    def __init__(self) -> None:
        sys.stderr.flush()
        self.real = os.fdopen(
            os.dup(2), "w", encoding="utf-8", errors="backslashreplace", buffering=1
        )
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._marker = f"gpuslice-stderr-drained-{os.getpid()}-"
        self._sent = self._seen = 0
        self._changed = threading.Condition()
        threading.Thread(
            target=self._pump, args=(read_fd,), name="gpuslice-stderr", daemon=True
        ).start()
        atexit.register(self.drain)

    def drain(self, timeout_s: float = 1.0) -> None:
        """Wait until every line written to fd 2 so far has been logged."""
        sys.stderr.flush()
        with self._changed:
            self._sent += 1
            sent = self._sent
        try:
            os.write(2, f"{self._marker}{sent}\n".encode())
        except OSError:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._seen >= sent, timeout_s)

    def _pump(self, read_fd: int) -> None:
        log = structlog.get_logger("gpuslice.stderr")
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith(self._marker):
                    with self._changed:
                        self._seen = int(line.removeprefix(self._marker))
                        self._changed.notify_all()
                elif line.strip():
                    with contextlib.suppress(OSError, ValueError):  # no real stderr left
                        _log_line(log, line)


def _log_line(log: structlog.typing.FilteringBoundLogger, line: str) -> None:
    grpc = _GRPC_LINE.fullmatch(line)
    if grpc is None:
        log.warning("stderr", text=line)
        return
    severity, where, text = grpc.groups()
    getattr(log, _GRPC_LEVEL[severity])("grpc_core", text=text, at=where)


_pump: _StderrPump | None = None
