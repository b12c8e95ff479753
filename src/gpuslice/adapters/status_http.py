"""A tiny HTTP endpoint for probes: /healthz (the loop answers) and /readyz
(200 when ready, 503 otherwise, with a JSON body saying why), and /metrics when
the agent has metrics (Prometheus text, rendered on the loop at each scrape)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
from collections.abc import Callable
from typing import Any

import structlog

from gpuslice.config.flags import split_address
from gpuslice.core.errors import BackendError

log = structlog.get_logger("gpuslice.status")

# () -> (ready, details)
ReadinessProbe = Callable[[], tuple[bool, dict[str, Any]]]
# () -> (content type, body)
MetricsPage = Callable[[], tuple[str, bytes]]
JSON = "application/json"
MAX_HEADER_LINES = 100
NAME = "--status-address (GPUSLICE_STATUS_ADDRESS)"  # what a listen error names
_WHY = {
    errno.EADDRINUSE: "the port is in use (with hostNetwork: by any process on the node)",
    errno.EADDRNOTAVAIL: "not an address of this host",
    errno.EACCES: "permission denied (ports below 1024 need privileges)",
}


class StatusServer:
    def __init__(
        self, address: str, readiness: ReadinessProbe, metrics: MetricsPage | None = None
    ) -> None:
        split = split_address(address)
        if split is None:
            raise BackendError(f"{NAME} {address}: expected host:port")
        self._address = address
        self._host = split[0] or "0.0.0.0"  # noqa: S104 - probes come from the kubelet
        self._port = split[1]
        self._readiness = readiness
        self._metrics = metrics
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> StatusServer:
        try:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        except socket.gaierror as exc:
            raise BackendError(f"{NAME} {self._address}: unknown host ({exc.strerror})") from exc
        except UnicodeError as exc:  # IDNA refuses the name: an empty or over-long label
            raise BackendError(f"{NAME} {self._address}: not a valid host name") from exc
        except OSError as exc:
            why = _WHY.get(exc.errno or 0) or " ".join(str(exc).split())
            raise BackendError(f"{NAME} {self._address}: cannot listen: {why}") from exc
        log.info("status_serving", address=f"{self._host}:{self.port}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            parts = request.decode("latin-1").split()
            path = parts[1].partition("?")[0] if len(parts) > 1 else ""
            # An HTTP/1.x request has headers: read them all, as closing a socket with
            # unread data sends a reset that may destroy the reply on its way.
            for _ in range(MAX_HEADER_LINES if len(parts) > 2 else 0):
                if await asyncio.wait_for(reader.readline(), 5) in (b"\r\n", b"\n", b""):
                    break
            status, kind, payload = self._respond(path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _respond(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics" and self._metrics is not None:
            kind, page = self._metrics()
            return "200 OK", kind, page
        status, body = self._route(path)
        return status, JSON, json.dumps(body, sort_keys=True).encode()

    def _route(self, path: str) -> tuple[str, dict[str, Any]]:
        if path == "/healthz":
            return "200 OK", {"ok": True}
        if path == "/readyz":
            ready, details = self._readiness()
            return ("200 OK" if ready else "503 Service Unavailable"), {"ready": ready, **details}
        paths = "/healthz, /readyz or /metrics" if self._metrics else "/healthz or /readyz"
        return "404 Not Found", {"error": f"no such path {path!r}; use {paths}"}
