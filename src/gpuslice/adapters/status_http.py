"""Tiny HTTP endpoints: probes on --status-address, /healthz (the loop answers) and
/readyz (200 when ready, 503 otherwise, with a JSON body saying why), and /metrics
(Prometheus text) there or alone on --metrics-address.

Every request is bounded: a request line over MAX_LINE bytes is answered 414, headers
over MAX_HEADER_BYTES or MAX_HEADER_LINES 431, each in one line; the whole request
must arrive and the answer be taken within `timeout_s`, or the connection is closed;
beyond `max_connections` open at once, the oldest is closed, so that slow clients
can neither pile up file descriptors nor keep the kubelet's probes out. /metrics
is rendered off the loop (the agent's state is read on it first, which is cheap), one
render at a time: every request that arrives while one runs shares it. The port is
bound with SO_REUSEPORT, so that an agent's successor started beside it (sharing the
node's network under hostNetwork) can listen on the same port while the old one runs;
`unix_path` serves the same endpoints on a unix socket of the pod's own, so that exec probes
reach their own pod's agent, whichever agent the shared port hands a connection to.
With `authorize`, /metrics answers only requests whose Authorization header it allows:
401 without a known token (with the `WWW-Authenticate: Bearer` challenge RFC 9110 asks
of every 401), 403 for a user who may not read it, 503 when it cannot tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gpuslice.config.flags import split_address
from gpuslice.core.access_cache import AccessVerdict, Outcome
from gpuslice.core.errors import BackendError

log = structlog.get_logger("gpuslice.status")

# () -> (ready, details)
ReadinessProbe = Callable[[], tuple[bool, dict[str, Any]]]
# () -> (content type, body); called off the loop
MetricsPage = Callable[[], tuple[str, bytes]]
# the Authorization header (None: absent) -> whether /metrics may be read
Authorize = Callable[[str | None], Awaitable[AccessVerdict]]
_REFUSED = {
    Outcome.UNAUTHENTICATED: "401 Unauthorized",
    Outcome.FORBIDDEN: "403 Forbidden",
    Outcome.UNAVAILABLE: "503 Service Unavailable",
}
CHALLENGE = 'Bearer realm="gpuslice"'  # the scheme /metrics takes, on every 401
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
MAX_LINE = 8 * 1024  # the request line, and any one header line
MAX_HEADER_LINES = 100
MAX_HEADER_BYTES = 16 * 1024
MAX_CONNECTIONS = 32
TIMEOUT_S = 5.0
NAME = "--status-address (GPUSLICE_STATUS_ADDRESS)"  # what a listen error names
METRICS_NAME = "--metrics-address (GPUSLICE_METRICS_ADDRESS)"
_WHY = {
    errno.EADDRINUSE: "the port is in use (with hostNetwork: by any process on the node)",
    errno.EADDRNOTAVAIL: "not an address of this host",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}
Reply = tuple[str, str, bytes]  # status, content type, body


class _TooLargeError(Exception):
    def __init__(self, status: str, what: str) -> None:
        super().__init__(what)
        self.status = status


class SharedRender:
    """One render of a page at a time, off the loop; callers that come while it runs
    share its result. `prepare` (on the loop) reads what the render needs first."""

    def __init__(self, render: MetricsPage, prepare: Callable[[], None] | None = None) -> None:
        self._render = render
        self._prepare = prepare
        self._running: asyncio.Future[tuple[str, bytes]] | None = None
        self.renders = 0  # how many renders ran

    async def page(self) -> tuple[str, bytes]:
        running = self._running
        if running is None:
            if self._prepare is not None:
                self._prepare()
            self.renders += 1
            running = asyncio.ensure_future(asyncio.to_thread(self._render))
            self._running = running
            running.add_done_callback(self._done)
        return await asyncio.shield(running)

    def _done(self, future: asyncio.Future[tuple[str, bytes]]) -> None:
        if self._running is future:
            self._running = None


class StatusServer:
    """Serves the probes (when `readiness` is given) and /metrics (when `metrics` is)."""

    def __init__(
        self,
        address: str,
        readiness: ReadinessProbe | None,
        metrics: MetricsPage | SharedRender | None = None,
        *,
        name: str = NAME,
        timeout_s: float = TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        authorize: Authorize | None = None,
        unix_path: str = "",
    ) -> None:
        self._name = name
        split = split_address(address)
        if split is None:
            raise BackendError(f"{name} {address}: expected host:port")
        self._address = address
        self._host = split[0] or "0.0.0.0"  # noqa: S104 - probes come from the kubelet
        self._port = split[1]
        self._readiness = readiness
        self._metrics = SharedRender(metrics) if callable(metrics) else metrics
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._authorize = authorize
        self._unix_path = unix_path
        self._open: dict[asyncio.Transport, None] = {}  # oldest first
        self._server: asyncio.Server | None = None
        self._unix: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def __aenter__(self) -> StatusServer:
        try:
            self._server = await asyncio.start_server(
                self._handle, self._host, self._port, limit=MAX_LINE, reuse_port=True
            )
        except socket.gaierror as exc:
            why = f"unknown host ({exc.strerror})"
            raise BackendError(f"{self._name} {self._address}: {why}") from exc
        except UnicodeError as exc:  # IDNA refuses the name: an empty or over-long label
            raise BackendError(f"{self._name} {self._address}: not a valid host name") from exc
        except OSError as exc:
            why = _WHY.get(exc.errno or 0) or " ".join(str(exc).split())
            raise BackendError(f"{self._name} {self._address}: cannot listen: {why}") from exc
        if self._unix_path:
            await self._listen_unix()
        log.info("status_serving", address=f"{self._host}:{self.port}", paths=self._paths(),
                 socket=self._unix_path or None)  # fmt: skip
        return self

    async def _listen_unix(self) -> None:
        with contextlib.suppress(FileNotFoundError):  # a previous run's, in the pod's own dir
            if socket_file(self._unix_path):
                os.unlink(self._unix_path)
        try:
            self._unix = await asyncio.start_unix_server(
                self._handle, self._unix_path, limit=MAX_LINE
            )
        except OSError as exc:
            await self.__aexit__()
            why = " ".join(str(exc).split())
            raise BackendError(f"--status-socket {self._unix_path}: cannot listen: {why}") from exc

    async def __aexit__(self, *exc: object) -> None:
        if self._unix is not None:
            self._unix.close()
            await self._unix.wait_closed()
            self._unix = None
            with contextlib.suppress(FileNotFoundError):
                if socket_file(self._unix_path):
                    os.unlink(self._unix_path)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = writer.transport
        assert isinstance(transport, asyncio.Transport)
        if len(self._open) >= self._max_connections:  # its fd is freed now
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.abort()
        self._open[transport] = None
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    path, authorization = await _read_request(reader)
                    if transport.is_closing():  # closed to make room for a newer one
                        return
                    reply = await self._respond(path, authorization)
                except _TooLargeError as exc:
                    reply = exc.status, TEXT, f"{exc}\n".encode()
                await _send(writer, reply)
                if reply[0].startswith("4"):
                    writer.write_eof()
                    await _drain_input(reader)
                writer.close()
                await writer.wait_closed()
        except OSError as exc:  # a slow or vanished client (ENOTCONN, a reset, a timeout):
            log.debug("status_client_gone", error=_why(exc))  # its problem only
            writer.transport.abort()  # its fd is freed now
        finally:
            self._open.pop(transport, None)
            if not writer.transport.is_closing():
                writer.transport.abort()

    async def _respond(self, path: str, authorization: str | None) -> Reply:
        if path == "/metrics" and self._metrics is not None:
            if self._authorize is not None:
                verdict = await self._authorize(authorization)
                if verdict.outcome is not Outcome.ALLOWED:
                    refusal = json.dumps({"error": verdict.why}).encode()
                    return _REFUSED[verdict.outcome], JSON, refusal
            kind, page = await self._metrics.page()
            return "200 OK", kind, page
        status, body = self._route(path)
        return status, JSON, json.dumps(body, sort_keys=True).encode()

    def _route(self, path: str) -> tuple[str, dict[str, Any]]:
        if self._readiness is not None:
            if path == "/healthz":
                return "200 OK", {"ok": True}
            if path == "/readyz":
                ready, details = self._readiness()
                status = "200 OK" if ready else "503 Service Unavailable"
                return status, {"ready": ready, **details}
        return "404 Not Found", {"error": f"no such path {path[:100]!r}; use {self._paths()}"}

    def _paths(self) -> str:
        paths = ["/healthz", "/readyz"] if self._readiness is not None else []
        paths += ["/metrics"] if self._metrics is not None else []
        return " or ".join(paths)


def _why(exc: OSError) -> str:
    """A socket error in a few words: its errno's name, or the timeout."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str | None]:
    """The request's path and Authorization header, once its headers are read. Raises
    _TooLargeError."""
    try:
        request = await reader.readline()
    except ValueError:  # over the reader's limit
        raise _TooLargeError("414 URI Too Long", f"request line over {MAX_LINE} bytes") from None
    parts = request.decode("latin-1").split()
    path = parts[1].partition("?")[0] if len(parts) > 1 else ""
    authorization = None
    # An HTTP/1.x request has headers: read them all, as closing a socket with
    # unread data sends a reset that may destroy the reply on its way.
    if len(parts) > 2:
        size = 0
        for _ in range(MAX_HEADER_LINES + 1):
            try:
                line = await reader.readline()
            except ValueError:
                raise _TooLargeError("431 Request Header Fields Too Large", _HEADERS) from None
            if line in (b"\r\n", b"\n", b""):
                return path, authorization
            if line[:14].lower() == b"authorization:":
                authorization = line[14:].decode("latin-1").strip()
            size += len(line)
            if size > MAX_HEADER_BYTES:
                raise _TooLargeError("431 Request Header Fields Too Large", _HEADERS)
        raise _TooLargeError("431 Request Header Fields Too Large", _HEADERS)
    return path, authorization


_HEADERS = (
    f"request headers over {MAX_HEADER_BYTES} bytes, {MAX_HEADER_LINES} lines "
    f"or {MAX_LINE} bytes in one line"
)


async def _send(writer: asyncio.StreamWriter, reply: Reply) -> None:
    status, kind, payload = reply
    challenge = f"WWW-Authenticate: {CHALLENGE}\r\n" if status.startswith("401") else ""
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n{challenge}"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    await writer.drain()


async def _drain_input(reader: asyncio.StreamReader, cap: int = 1024 * 1024) -> None:
    """After refusing a request, read (and drop) what the client still sends, up to
    `cap` bytes, so that closing does not reset the connection under the reply."""
    with contextlib.suppress(ValueError):
        while cap > 0:
            chunk = await reader.read(min(cap, 64 * 1024))
            if not chunk:
                return
            cap -= len(chunk)


def socket_file(path: str) -> bool:
    """Whether `path` is a unix socket (not followed if a link): the only thing replaced."""
    return stat.S_ISSOCK(os.lstat(path).st_mode)
