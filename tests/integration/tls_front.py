"""An authenticating front for a real Prometheus, as OpenShift's Thanos querier or an
oauth proxy puts one: TLS with a certificate of a private CA, a bearer token and/or a
client certificate required, each allowed request forwarded to Prometheus and its
answer piped back. Certificates are made here with the openssl CLI."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

UNAUTHORIZED = (
    b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 13\r\nConnection: close\r\n\r\nUnauthorized\n"
)


@dataclass(frozen=True)
class Pki:
    """Two CAs: `ca` signed the front's certificate (127.0.0.1) and the client's; `other`
    signed only `other_client`, a client certificate the front does not know."""

    ca: Path
    server: tuple[Path, Path]  # certificate, key
    client: tuple[Path, Path]
    other: Path
    other_client: tuple[Path, Path]


def make_pki(work: Path) -> Pki:
    work.mkdir(parents=True, exist_ok=True)
    ca, other = _ca(work, "ca"), _ca(work, "other-ca")
    return Pki(
        ca,
        _leaf(work, "server", ca, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        _leaf(work, "client", ca, "extendedKeyUsage=clientAuth"),
        other,
        _leaf(work, "other-client", other, "extendedKeyUsage=clientAuth"),
    )


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _ca(work: Path, name: str) -> Path:
    _openssl("req", "-x509", *_KEY, "-keyout", work / f"{name}.key", "-out",
             work / f"{name}.crt", "-days", "2", "-subj", f"/CN=gpuslice test {name}")  # fmt: skip
    return work / f"{name}.crt"


def _leaf(work: Path, name: str, ca: Path, extensions: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (work / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
    ext.write_text(f"basicConstraints=CA:FALSE\n{extensions}\n")
    _openssl("req", *_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca.with_suffix(".key"),
             "-set_serial", "2", "-days", "2", "-out", cert, "-extfile", ext)  # fmt: skip
    return cert, key


@contextlib.contextmanager
def tls_front(
    pki: Pki, upstream_port: int, *, token: str = "", client_ca: Path | None = None
) -> Iterator[str]:
    """The front's https:// URL while it serves: `token` (when set) required as a bearer
    token, a client certificate signed by `client_ca` (when set) required in the TLS
    handshake. Blocking sockets, a thread per connection: a refused handshake ends with
    OpenSSL's alert on the wire, as Go's and nginx's do."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*pki.server)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(10)
            try:
                with context.wrap_socket(self.request, server_side=True) as conn:
                    self._forward(conn)
            except OSError:
                pass  # a refused handshake or a client that gave up: the test sees it

        def _forward(self, conn: ssl.SSLSocket) -> None:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    return
                head += chunk
            lines = head.decode("latin-1").split("\r\n")
            fields = dict(line.partition(": ")[::2] for line in lines[1:] if ": " in line)
            if token and fields.get("Authorization") != f"Bearer {token}":
                conn.sendall(UNAUTHORIZED)
                return
            # urllib asks Connection: close, so Prometheus ends its answer with EOF
            with socket.create_connection(("127.0.0.1", upstream_port), timeout=30) as up:
                up.sendall(head)
                while chunk := up.recv(1 << 16):
                    conn.sendall(chunk)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
