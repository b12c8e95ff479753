"""The chart's exec probe under hostNetwork: one GET of a status path over the agent's
--status-socket, exit 0 on a 2xx answer, 1 otherwise, the answer's first line and body
(at most MAX_ANSWER bytes) on stdout, where the kubelet's probe event shows them.

    python -I -m gpuslice.adapters.status_probe /run/gpuslice/status.sock /readyz

Stdlib only, and nothing of gpuslice is imported, so that a probe costs a bare interpreter
start: the kubelet runs it every few seconds.
"""

from __future__ import annotations

import socket
import sys

MAX_ANSWER = 64 * 1024
TIMEOUT_S = 4.0  # under the chart's probe timeoutSeconds (5)


def probe(path: str, target: str, timeout_s: float = TIMEOUT_S) -> tuple[bool, str]:
    """(whether the answer is 2xx, what to print)."""
    chunks, size = [], 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(f"GET {target} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
            while size < MAX_ANSWER and (chunk := sock.recv(MAX_ANSWER - size)):
                chunks.append(chunk)
                size += len(chunk)
    except OSError as exc:
        return False, f"{path}: {exc.strerror or exc}"
    head, _, body = b"".join(chunks).decode("utf-8", "replace").partition("\r\n\r\n")
    status = head.split("\r\n", 1)[0]
    parts = status.split()
    ok = len(parts) > 1 and parts[1].startswith("2")
    return ok, f"{status or 'no answer'} {body}".strip()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gpuslice.adapters.status_probe SOCKET PATH", file=sys.stderr)
        return 2
    ok, text = probe(argv[0], argv[1])
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
