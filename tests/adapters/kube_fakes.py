"""An HTTP-level Kubernetes API server fake on 127.0.0.1, and a helper to consume watches.

FakeApiServer speaks the part of the REST API the kube adapter uses, over real
HTTP/1.1 on a real socket (one request per connection):

- GET /api/v1/nodes/<name>; GET /api/v1/nodes?watch=true&fieldSelector=metadata.name=<n>
  (replays history after resourceVersion, then streams chunked JSON lines; BOOKMARK
  events only when allowWatchBookmarks=true; HTTP 410 for a version older than
  `expired_below`);
- GET/POST/PUT of nodefeatures.nfd.k8s-sigs.io in a namespace (PUT checks
  resourceVersion and answers 409 on a mismatch); GET of pods; POST of events
  (generateName honoured).

The test side plays the cluster (put_node, delete_node, bookmark), breaks watches
(expire_watches: an ERROR 410 event; drop_watches: the socket dies mid-stream;
end_watches: a clean end, as on the server's timeout), injects failures (fail_next)
and inspects every request it received.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from lightkube import AsyncClient, KubeConfig

NODES = "/api/v1/nodes"
NFD = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/"
WAIT_S = 5.0  # every awaited condition here is met in milliseconds when things work
_REASONS = {200: "OK", 201: "Created", 404: "Not Found", 409: "Conflict", 410: "Gone"}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any = None

    @property
    def is_watch(self) -> bool:
        return self.path == NODES and self.query.get("watch") == "true"


@dataclass
class _Stream:
    node: str
    bookmarks: bool
    queue: asyncio.Queue[bytes | str] = field(default_factory=asyncio.Queue)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": reason, "message": message, "code": code}  # fmt: skip


class FakeApiServer:
    def __init__(self) -> None:
        self.version = 100
        self.nodes: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.features: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.requests: list[Request] = []
        self.expired_below = 0
        self._failures: list[tuple[str, str, int]] = []
        self._streams: list[_Stream] = []
        self._arrived = asyncio.Condition()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._uids = itertools.count(1)
        self.url = ""

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        """Stop listening and cut every connection (clients then find nothing there)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # the cluster side

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def put_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        *,
        notify: bool = True,
    ) -> str:
        """Create or update a Node; notify=False hides the change from open watches
        (as if the events were lost), so only a re-read can see it."""
        old = self.nodes.get(name)
        version = self._bump()
        meta: dict[str, Any] = {
            "name": name,
            "uid": old["metadata"]["uid"] if old else f"uid-{name}-{next(self._uids)}",
            "resourceVersion": version,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        }
        obj = {"kind": "Node", "apiVersion": "v1", "metadata": meta, "spec": {}, "status": {}}
        self.nodes[name] = obj
        kind = "MODIFIED" if old else "ADDED"
        self.history.append((self.version, kind, obj))
        if notify:
            self._push(name, {"type": kind, "object": obj})
        return version

    def delete_node(self, name: str) -> None:
        obj = self.nodes.pop(name)
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": self._bump()}}
        self.history.append((self.version, "DELETED", obj))
        self._push(name, {"type": "DELETED", "object": obj})

    def bookmark(self) -> str:
        """Send a BOOKMARK at a new version to every watch that asked for bookmarks."""
        version = self._bump()
        event = {"type": "BOOKMARK", "object": {"kind": "Node", "apiVersion": "v1",
                 "metadata": {"resourceVersion": version}}}  # fmt: skip
        for stream in self._streams:
            if stream.bookmarks:
                stream.queue.put_nowait(json.dumps(event).encode() + b"\n")
        return version

    def expire_watches(self) -> None:
        """ERROR 410 on every open watch, then a clean end (what an API server does)."""
        event = {"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}
        for stream in self._streams:
            stream.queue.put_nowait(json.dumps(event).encode() + b"\n")
            stream.queue.put_nowait("end")

    def drop_watches(self) -> None:
        for stream in self._streams:
            stream.queue.put_nowait("drop")

    def end_watches(self) -> None:
        for stream in self._streams:
            stream.queue.put_nowait("end")

    def fail_next(self, method: str, path_part: str, code: int) -> None:
        """Answer the next `method` request whose path contains `path_part` with `code`."""
        self._failures.append((method, path_part, code))

    def _push(self, name: str, event: dict[str, Any]) -> None:
        for stream in self._streams:
            if stream.node == name:
                stream.queue.put_nowait(json.dumps(event).encode() + b"\n")

    # inspection

    def of(self, method: str, path_part: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and path_part in r.path]

    def watches(self) -> list[Request]:
        return [r for r in self.requests if r.is_watch]

    def open_watches(self) -> int:
        return len(self._streams)

    async def wait_for(self, predicate: Callable[[FakeApiServer], bool]) -> None:
        """Wait until predicate(self) holds; checked after every request and stream change."""
        async with asyncio.timeout(WAIT_S), self._arrived:
            await self._arrived.wait_for(lambda: predicate(self))

    async def _changed(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()

    # HTTP

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, target, _ = head[0].split(" ", 2)
        headers = {
            k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in head[1:] if h)
        }
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        url = urlsplit(target)
        req = Request(method, url.path, dict(parse_qsl(url.query)), headers,
                      json.loads(raw) if raw else None)  # fmt: skip
        self.requests.append(req)
        await self._changed()
        for failure in self._failures:
            if failure[0] == method and failure[1] in url.path:
                self._failures.remove(failure)
                return await self._reply(
                    writer, failure[2], _status(failure[2], "Injected", "injected")
                )
        if req.is_watch:
            return await self._watch(req, writer)
        code, body = self._route(req)
        await self._reply(writer, code, body)

    async def _reply(self, writer: asyncio.StreamWriter, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    def _route(self, req: Request) -> tuple[int, Any]:
        parts = req.path.strip("/").split("/")
        if req.path.startswith(NODES + "/") and req.method == "GET":
            node = self.nodes.get(parts[3])
            return (200, node) if node else (404, _status(404, "NotFound", "node not found"))
        if req.path.startswith(NFD) and parts[5] == "nodefeatures":
            return self._node_feature(req, parts[4], parts[6] if len(parts) > 6 else None)
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods" and req.method == "GET":
            pod = self.pods.get((parts[3], parts[5]))
            return (200, pod) if pod else (404, _status(404, "NotFound", "pod not found"))
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "events":
            event = req.body
            event["metadata"].setdefault("name", event["metadata"]["generateName"] + "x1")
            self.events.append(event)
            return 201, event
        return 404, _status(404, "NotFound", f"no route for {req.method} {req.path}")

    def _node_feature(self, req: Request, ns: str, name: str | None) -> tuple[int, Any]:
        if req.method == "GET":
            obj = self.features.get((ns, name or ""))
            return (200, obj) if obj else (404, _status(404, "NotFound", "nodefeature not found"))
        body = req.body
        key = (ns, body["metadata"]["name"])
        stored = self.features.get(key)
        if req.method == "POST" and stored is not None:
            return 409, _status(409, "AlreadyExists", "already exists")
        if req.method == "PUT" and (
            stored is None
            or body["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]
        ):
            return 409, _status(409, "Conflict", "the object has been modified")
        body["metadata"]["resourceVersion"] = self._bump()
        self.features[key] = body
        return (201 if req.method == "POST" else 200), body

    async def _watch(self, req: Request, writer: asyncio.StreamWriter) -> None:
        selector = req.query.get("fieldSelector", "")
        assert selector.startswith("metadata.name="), selector
        node = selector.removeprefix("metadata.name=")
        since = req.query.get("resourceVersion")
        if since and int(since) < self.expired_below:
            return await self._reply(
                writer, 410, _status(410, "Expired", "too old resource version")
            )
        stream = _Stream(node, req.query.get("allowWatchBookmarks") == "true")
        if since:
            replay = [(kind, obj) for v, kind, obj in self.history
                      if v > int(since) and obj["metadata"]["name"] == node]  # fmt: skip
        else:
            replay = [("ADDED", self.nodes[node])] if node in self.nodes else []
        for kind, obj in replay:
            stream.queue.put_nowait(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        self._streams.append(stream)
        await self._changed()
        try:
            while True:
                item = await stream.queue.get()
                if item == "drop":
                    writer.transport.abort()
                    return
                if item == "end":
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return
                assert isinstance(item, bytes)
                writer.write(f"{len(item):x}\r\n".encode() + item + b"\r\n")
                await writer.drain()
        finally:
            self._streams.remove(stream)
            await self._changed()


class Follower:
    """Consumes an async iterator in a task so its yields can be awaited one at a time."""

    def __init__(self, source: AsyncIterator[dict[str, str]]) -> None:
        self._source = source
        self._items: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for item in self._source:
            self._items.put_nowait(item)

    async def next(self) -> dict[str, str]:
        """The next yield; re-raises what the iterator raised."""
        getter = asyncio.ensure_future(self._items.get())
        done, _ = await asyncio.wait({getter, self._task}, timeout=WAIT_S,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if getter in done:
            return getter.result()
        getter.cancel()
        if self._task in done:
            self._task.result()
            raise StopAsyncIteration
        raise TimeoutError("no yield within the timeout")

    def pending(self) -> int:
        return self._items.qsize()

    async def close(self) -> None:
        """Stop consuming; what the iterator raised was already reported by next()."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


TOKEN = "t0ken"


def write_kubeconfig(directory: Path, url: str) -> str:
    """A kubeconfig file for `url` with a bearer token user and a default namespace."""
    path = directory / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "fake", "user": {"token": TOKEN}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )
    return str(path)


FAST_BACKOFF = (0.005, 0.05)  # seconds: keeps reconnect tests in milliseconds


def fake_client(url: str, directory: Path) -> AsyncClient:
    """A lightkube client for `url` through a kubeconfig file; it ignores proxy
    variables so 127.0.0.1 is always reached directly."""
    config = KubeConfig.from_file(write_kubeconfig(directory, url))
    return AsyncClient(config=config, trust_env=False)
