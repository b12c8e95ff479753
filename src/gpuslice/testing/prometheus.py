"""A synthetic Prometheus HTTP API: the few queries `gpuslice advise` asks, answered for
`pods` containers whose memory follows fixed curves, over real HTTP on 127.0.0.1.

For the bad-input tests (`respond` replaces every answer) and the bench (run as
`python -m gpuslice.testing.prometheus PODS`, it prints its URL and serves until
stdin closes). Answers are built from a few pre-formatted curves so that even 1,000
series over 7 days cost the server little next to the reader being measured.
"""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MIB = 1024 * 1024
GPU_MIB = 40960
MODEL = "NVIDIA A100-SXM4-40GB"
CURVES = 16  # distinct memory curves the series cycle through
Answer = tuple[int, str, bytes]  # status, content type, body
Respond = Callable[[str, dict[str, str]], Answer]


def pod_labels(i: int) -> dict[str, str]:
    return {
        "namespace": f"team-{i % 10}", "pod": f"job{i // 4}-7f9c8d6b5-{i:05d}",
        "container": "main", "resource": "nvidia.com/gpu", "modelName": MODEL,
        "UUID": f"GPU-{i // 4:08d}", "hostname": f"node-{i // 32}",
    }  # fmt: skip


def memory_mib(curve: int, k: int) -> int:
    """Memory of a curve at step k (time k x step): 1,000 to 9,284 MiB, 50 levels each."""
    return 1000 + 500 * curve + 16 * ((k * 7 + curve) % 50)


def curve_of(pod: int) -> int:
    """The curve of the pod-th series: spread so that a few pods show every verdict."""
    return pod * 13 % CURVES


def share_of(curve: int) -> bytes:
    """The share of its GPU a pod of this curve holds: 1/5 for the two biggest curves
    (over-packed), else 1/4 (curve 12 and 13 fit, the others waste it)."""
    return b"0.2" if curve >= CURVES - 2 else b"0.25"


PEAK_MIB = [max(memory_mib(c, k) for k in range(50)) for c in range(CURVES)]
_SUBQUERY = re.compile(r"\[(\d+)ms:(\d+)ms\]\)$")


class SyntheticPrometheus:
    def __init__(self, pods: int, respond: Respond | None = None) -> None:
        self.pods = pods
        self.respond = respond
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._labels = [b'{"metric":' + json.dumps(pod_labels(i)).encode() for i in range(pods)]
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                fake.requests.append((url.path, params))
                status, ctype, body = fake.answer(url.path, params)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> SyntheticPrometheus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, params: dict[str, str]) -> Answer:
        if self.respond is not None:
            return self.respond(path, params)
        return self.synthetic(path, params)

    def synthetic(self, path: str, params: dict[str, str]) -> Answer:
        """The answer from the curves (what `respond` may start from)."""
        if path != "/api/v1/query":
            return 404, "text/plain", b"404 page not found"
        query, at = params.get("query", ""), params.get("time", "0")
        if query.startswith("count("):
            return ok("vector", f'[{{"metric":{{}},"value":[{at},"{self.pods}"]}}]'.encode())
        if "count_values" in query:
            return ok("vector", self._counts(query, float(at)))
        if "gpu_memory_total_bytes" in query:
            gpus = sorted({pod_labels(i)["UUID"] for i in range(self.pods)})
            each = [f'{{"metric":{{"UUID":"{u}"}},"value":[{at},"{GPU_MIB * MIB}"]}}' for u in gpus]
            return ok("vector", ("[" + ",".join(each) + "]").encode())
        if "allocated_ratio" in query:
            values = [share_of(c) for c in range(CURVES)]
        elif "peak_bytes" in query or "memory_used_bytes" in query:
            values = [b"%d" % (PEAK_MIB[c] * MIB) for c in range(CURVES)]
        else:
            return ok("vector", b"[]")
        items = [
            b'%s,"value":[%s,"%s"]}' % (self._labels[i], at.encode(), values[curve_of(i)])
            for i in range(self.pods)
        ]
        return ok("vector", b"[" + b",".join(items) + b"]")

    def _counts(self, query: str, at: float) -> bytes:
        """Per series and value, how many steps of the subquery [L:S] at `at` had it."""
        match = _SUBQUERY.search(query)
        if match is None:
            raise ValueError(query)
        length, step = int(match.group(1)) / 1000, int(match.group(2)) / 1000
        steps = range(math.floor((at - length) / step) + 1, math.floor(at / step) + 1)
        memory = "memory_used_bytes" in query
        blocks = []
        for curve in range(CURVES):
            counts = Counter(
                memory_mib(curve, k) if memory else (k + curve) % 20 * 5 for k in steps
            )
            blocks.append([(b"%d" % v, b"%d" % n) for v, n in sorted(counts.items())])
        at_text = b"%.3f" % at
        items = [
            b'%s,"v":"%s"},"value":[%s,"%s"]}' % (self._labels[i][:-1], v, at_text, n)
            for i in range(self.pods)
            for v, n in blocks[curve_of(i)]
        ]
        return b"[" + b",".join(items) + b"]"


def ok(kind: str, result: bytes) -> Answer:
    body = b'{"status":"success","data":{"resultType":"%s","result":%s}}' % (kind.encode(), result)
    return 200, "application/json", body


def main() -> None:
    with SyntheticPrometheus(int(sys.argv[1])) as fake:
        print(fake.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
