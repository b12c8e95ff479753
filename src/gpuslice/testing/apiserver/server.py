"""FakeApiServer: the part of the Kubernetes REST API the agent uses, over real HTTP/1.1
on 127.0.0.1 (a connection kept open between plain answers, as a real server keeps it),
with the answers a real API server gives.

- GET /api/v1/nodes/<name>; GET /api/v1/nodes?watch=true&fieldSelector=metadata.name=<n>
  (replays history after resourceVersion, then streams chunked JSON lines; BOOKMARK
  events only when allowWatchBookmarks=true; HTTP 410 for a version older than
  `expired_below`; ended cleanly after its timeoutSeconds, divided by `time_scale` for
  an accelerated run; a streaming list (sendInitialEvents=true, which needs
  allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan, else 422) ends its
  initial events with a bookmark, or is refused as `watch_lists_refused` says;
  watches.py); a list of nodes by fieldSelector metadata.name, whose
  resourceVersion is the server's current one, as a real list's is;
- GET of configmaps in a namespace, by name, as such a list and as the same watch as nodes;
- GET/POST/PUT of nodefeatures.nfd.k8s-sigs.io in a namespace (PUT checks
  resourceVersion and answers 409 on a mismatch); 404 for every such path while
  `nfd_installed` is False, as when NFD's CRD is missing;
- resource.k8s.io/v1 ResourceSlices (watched as a collection by field selectors too)
  and ResourceClaims (dra.py);
- GET of pods; POST of events (generateName honoured, 409 for a name taken; an Event
  about a cluster-scoped object outside namespace default is refused with 422, as
  validation does), GET and merge PATCH of an Event by name (409 for a resourceVersion
  that is not the stored one);
- POST of TokenReviews and SubjectAccessReviews (non-resource URLs), from the tokens and
  grants of `reviews` (reviews.py);
- with `grants` set, every request that no grant covers is refused with 403 Forbidden.

The test side plays the cluster (put_node, delete_node, put_config_map,
delete_config_map, put_pod, bookmark), restarts the server (restart: every connection
cut, and a watch cache that starts at a new resourceVersion, so a watch from any older
one is answered 410 Gone, as a restarted API server answers it; optionally a watch cache
still filling, whose watches are answered 429), breaks
watches (expire_watches: an ERROR 410 event; drop_watches: the socket dies mid-stream;
end_watches: a clean end, as on the server's timeout), injects failures (fail_next),
answers with broken bodies (corrupt_next: bytes that are not JSON, or a body that says
gzip and is not), never answers (stall_next: the request is read and left hanging until
close()), answers late (answer_late: every request held a while before it is handled, as by
a loaded server, past a client's read timeout if long enough; on_time ends it and lets the
held ones through), and inspects every request it received, with the status code it was
answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpuslice.testing.apiserver.access import Grant, access_of, allowed, forbidden
from gpuslice.testing.apiserver.dra import SLICES, DraObjects
from gpuslice.testing.apiserver.reviews import Reviews
from gpuslice.testing.apiserver.status import (
    REASONS,
    invalid,
    no_such_resource,
    not_found,
    status,
    write_refusal,
)
from gpuslice.testing.apiserver.watches import (
    DROP,
    END,
    REFUSED_WATCH_LIST,
    STORAGE,
    Watches,
    list_problem,
)

NODES = "/api/v1/nodes"
NAMESPACES = "/api/v1/namespaces/"
NFD = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/"
GARBAGE = "garbage"  # corrupt_next: a 200 whose body is not JSON (nor UTF-8)
BAD_GZIP = "gzip"  # corrupt_next: a 200 that says Content-Encoding gzip and is not gzip
GZIP_BOMB = "gzip-bomb"  # corrupt_next: a 200 of 256 KiB of gzip that inflates to 256 MiB
_CORRUPT = {
    GARBAGE: (b'\x00\xff{"kind": \x9c[[[\n\xfe\n', ""),
    BAD_GZIP: (b"\x1f\x8b\x08\x00 not gzip", "gzip"),
}


def _corrupt(how: str) -> tuple[bytes, str]:
    if how == GZIP_BOMB:
        bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
        zeros = bytes(1 << 20)
        return b"".join([*(bomb.compress(zeros) for _ in range(256)), bomb.flush()]), "gzip"
    return _CORRUPT[how]


# What refuses a streaming list, by code: a proxy, the WatchList feature gate off, storage.
REFUSALS = {
    400: ("BadRequest", "sendInitialEvents: unsupported query parameter"),
    422: (
        "Invalid",
        'ListOptions.meta.k8s.io "" is invalid: sendInitialEvents: Forbidden: '
        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is "
        "enabled",
    ),
    500: ("InternalError", REFUSED_WATCH_LIST),
}
WAIT_S = 5.0  # every awaited condition here is met in milliseconds when things work
USER = "system:serviceaccount:gpu-operator:gpuslice"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any = None
    code: int | None = None  # the status it was answered with

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") == "true" and _collection(self.path) is not None


class FakeApiServer:
    """Nodes, ConfigMaps, NodeFeatures, Pods and Events in dictionaries; `grants` None
    allows all."""

    def __init__(self, grants: Iterable[Grant] | None = None, user: str = USER) -> None:
        self.version = 100
        self.nodes: dict[str, dict[str, Any]] = {}
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.watch_state = Watches()
        self.features: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.dra = DraObjects(self._bump, self._recorded)  # ResourceSlices and ResourceClaims
        self.reviews = Reviews()  # tokens and non-resource grants
        self.requests: list[Request] = []
        self.expired_below = 0
        self.time_scale = 1.0  # server seconds per real second (a watch's timeoutSeconds)
        self.nfd_installed = True
        # Streaming lists: None served; STORAGE refused as over etcd 3.4; a code: answered
        # with it (a feature gate off: 422; a proxy: 400, 500).
        self.watch_lists_refused: int | str | None = None
        self.warming: asyncio.Event | None = None  # watches answered 429 until it is set
        self.grants: list[Grant] | None = None if grants is None else list(grants)
        self.user = user
        self._failures: list[tuple[str, str, int]] = []
        self._corruptions: list[tuple[str, str, str | bytes]] = []
        self._stalls: list[tuple[str, str]] = []
        self.late_s = 0.0  # answer_late: how long each request is held before it is handled
        self._on_time = asyncio.Event()
        self._arrived = asyncio.Condition()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._uids = itertools.count(1)
        self._names = itertools.count(1)
        self.url = ""

    async def start(self, port: int = 0) -> str:
        """Listen (again, after close(): on the same `port` it had, as after an outage)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        """Stop listening and cut every connection (clients then find nothing there)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        # Cancelled again until it ends: on 3.11 a wait_for whose item arrives with the
        # cancellation returns the item and drops the cancellation (the stream then waits on).
        while self._handlers:
            for task in list(self._handlers):
                task.cancel()
            await asyncio.wait(list(self._handlers), timeout=0.1)

    async def restart(
        self, down: asyncio.Event | None = None, warming: asyncio.Event | None = None
    ) -> None:
        """An API server restart: every connection cut, nothing listening until `down` is
        set (at once without one), then listening on the same port with a watch cache that
        starts at a new resourceVersion (other writes moved it while the server was away):
        a watch from an older version, such as an unchanged object's, is answered 410.
        With `warming`, until it is set every watch is answered 429 "storage is
        (re)initializing" with Retry-After 1 (reads are served), as a starting server's
        watch cache answers while it fills."""
        port = int(self.url.rsplit(":", 1)[1])
        await self.close()
        if down is not None:
            await down.wait()
        self.warming = warming
        self.reset_watch_cache()
        await self.start(port)

    def reset_watch_cache(self) -> None:
        """A new process's watch cache: filled from storage at a new resourceVersion."""
        self.expired_below = int(self._bump())
        self.watch_state.history.clear()

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # the cluster side

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def put_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
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
        self.watch_state.record(self.version, NODES, kind, obj, notify)
        return version

    def delete_node(self, name: str) -> None:
        obj = self.nodes.pop(name)
        self._deleted(NODES, obj)

    def put_config_map(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
        *,
        notify: bool = True,
    ) -> str:
        """Create or replace a ConfigMap (what `kubectl apply` or `edit` leaves);
        notify=False as for put_node."""
        old = self.config_maps.get((namespace, name))
        version = self._bump()
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": old["metadata"]["uid"] if old else f"uid-{name}-{next(self._uids)}",
            "resourceVersion": version,
            "annotations": dict(annotations or {}),
        }
        obj = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta, "data": dict(data)}
        self.config_maps[(namespace, name)] = obj
        kind = "MODIFIED" if old else "ADDED"
        self.watch_state.record(self.version, _config_maps(namespace), kind, obj, notify)
        return version

    def delete_config_map(self, namespace: str, name: str) -> None:
        obj = self.config_maps.pop((namespace, name))
        self._deleted(_config_maps(namespace), obj)

    def _recorded(self, collection: str, kind: str, obj: dict[str, Any]) -> None:
        """A change the DRA objects made at the current version (seen by watches)."""
        self.watch_state.record(self.version, collection, kind, obj)

    def _deleted(self, collection: str, obj: dict[str, Any]) -> None:
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": self._bump()}}
        self.watch_state.record(self.version, collection, "DELETED", obj)

    def put_pod(
        self, namespace: str, name: str, owners: Iterable[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """Create a Pod with these metadata.ownerReferences; returns it."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace,
                                "uid": f"uid-{name}-{next(self._uids)}",
                                "resourceVersion": self._bump()}  # fmt: skip
        if owners:
            meta["ownerReferences"] = [dict(owner) for owner in owners]
        spec = {"containers": [{"name": "agent", "image": "gpuslice"}]}
        pod = {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": {}}
        self.pods[(namespace, name)] = pod
        return pod

    def bookmark(self) -> str:
        """Send a BOOKMARK at a new version to every watch that asked for bookmarks."""
        version = self._bump()
        self.watch_state.bookmark(version)
        return version

    def expire_watches(self) -> None:
        """ERROR 410 on every open watch, then a clean end (what an API server does)."""
        self.watch_state.expire()

    def drop_watches(self) -> None:
        self.watch_state.cut(DROP)

    def end_watches(self) -> None:
        self.watch_state.cut(END)

    def fail_next(self, method: str, path_part: str, code: int) -> None:
        """Answer the next `method` request whose path contains `path_part` with `code`."""
        self._failures.append((method, path_part, code))

    def corrupt_next(self, method: str, path_part: str, how: str | bytes = GARBAGE) -> None:
        """Answer the next `method` request (a watch too) whose path contains `path_part`
        with 200 and a broken body: GARBAGE, BAD_GZIP, GZIP_BOMB, or these bytes."""
        self._corruptions.append((method, path_part, how))

    def stall_next(self, method: str, path_part: str) -> None:
        """Never answer the next `method` request whose path contains `path_part`."""
        self._stalls.append((method, path_part))

    def answer_late(self, seconds: float) -> None:
        """Hold every request `seconds` before handling it, until on_time()."""
        self.late_s = seconds
        self._on_time = asyncio.Event()

    def on_time(self) -> None:
        """Answer at once again; the requests held now go through."""
        self.late_s = 0.0
        self._on_time.set()

    # inspection

    def of(self, method: str, path_part: str = "") -> list[Request]:
        return [r for r in self.requests if r.method == method and path_part in r.path]

    def watches(self, path_part: str = NODES) -> list[Request]:
        """The watch requests whose path contains `path_part` (by default: of Nodes)."""
        return [r for r in self.requests if r.is_watch and path_part in r.path]

    def answered(self, code: int) -> list[Request]:
        """The requests answered with `code`."""
        return [r for r in self.requests if r.code == code]

    def open_watches(self, path_part: str = NODES) -> int:
        """The watches open now whose collection contains `path_part` (default: Nodes)."""
        return sum(path_part in s.collection for s in self.watch_state.streams)

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
            while await self._serve_one(reader, writer):
                pass  # kept alive, as an API server keeps a client's connection
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # close(): this connection's task ends quietly
            pass
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request; True when the connection stays open for the next (a plain
        answer to a client that did not ask to close)."""
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            return False  # the client closed its kept-alive connection
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
        if self.late_s:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.late_s):
                    await self._on_time.wait()
        refused = self._refusal(req)
        if refused is None:
            for failure in self._failures:
                if failure[0] == method and failure[1] in url.path:
                    self._failures.remove(failure)
                    refused = failure[2], status(failure[2], "Injected", "injected")
                    break
        for stall in self._stalls:
            if stall[0] == method and stall[1] in url.path:
                self._stalls.remove(stall)
                await asyncio.Event().wait()  # until close() cancels this connection
        for corruption in self._corruptions if refused is None else ():
            if corruption[0] == method and corruption[1] in url.path:
                self._corruptions.remove(corruption)
                how = corruption[2]
                broken = (how, "") if isinstance(how, bytes) else _corrupt(how)
                await self._reply_raw(writer, req, *broken)
                return False
        if refused is None and req.is_watch:
            await self._watch(req, writer)
            return False
        code, body = refused or self._route(req)
        keep = headers.get("connection", "").lower() != "close"
        await self._reply(writer, req, code, body, keep=keep)
        return keep

    def _refusal(self, req: Request) -> tuple[int, Any] | None:
        """403 when grants are enforced and none covers the request."""
        access = access_of(req.method, req.path, req.query)
        if self.grants is None or access is None or allowed(self.grants, access):
            return None
        return 403, forbidden(access, self.user)

    async def _reply(
        self,
        writer: asyncio.StreamWriter,
        req: Request,
        code: int,
        body: Any,
        *,
        keep: bool = False,
        headers: str = "",
    ) -> None:
        data = json.dumps(body).encode()
        await self._reply_raw(writer, req, data, code=code, keep=keep, headers=headers)

    async def _reply_raw(
        self,
        writer: asyncio.StreamWriter,
        req: Request,
        data: bytes,
        encoding: str = "",
        *,
        code: int = 200,
        keep: bool = False,
        headers: str = "",  # more header lines, each ending in CRLF
    ) -> None:
        req.code = code
        coding = f"Content-Encoding: {encoding}\r\n{headers}" if encoding else headers
        connection = "keep-alive" if keep else "close"
        writer.write(
            f"HTTP/1.1 {code} {REASONS.get(code, 'Error')}\r\nContent-Type: application/json\r\n"
            f"{coding}Content-Length: {len(data)}\r\nConnection: {connection}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        await self._changed()

    def _route(self, req: Request) -> tuple[int, Any]:
        parts = req.path.strip("/").split("/")
        dra = self.dra.route(req.method, req.path, req.query, req.body)
        if dra is not None:
            return dra
        review = self.reviews.route(req.method, req.path, req.body)
        if review is not None:
            return review
        if req.path.startswith(NODES + "/") and req.method == "GET":
            node = self.nodes.get(parts[3])
            return (200, node) if node else (404, not_found("nodes", parts[3]))
        if len(parts) == 6 and parts[4] == "configmaps" and req.method == "GET":
            found = self.config_maps.get((parts[3], parts[5]))
            return (200, found) if found else (404, not_found("configmaps", parts[5]))
        collection = _collection(req.path)
        if collection is not None and req.method == "GET":
            return self._list(collection, req.query)
        if req.path.startswith(NFD) and len(parts) > 5 and parts[5] == "nodefeatures":
            if not self.nfd_installed:
                return 404, no_such_resource()
            return self._node_feature(req, parts[4], parts[6] if len(parts) > 6 else None)
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) > 4:
            if parts[4] == "pods" and req.method == "GET" and len(parts) == 6:
                pod = self.pods.get((parts[3], parts[5]))
                return (200, pod) if pod else (404, not_found("pods", parts[5]))
            if parts[4] == "events" and req.method == "POST":
                return self._event(parts[3], req.body)
            if parts[4] == "events" and len(parts) == 6:
                return self._named_event(req, parts[3], parts[5])
        return 404, no_such_resource()

    def _stored_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        for event in self.events:
            if (event["metadata"]["namespace"], event["metadata"]["name"]) == (namespace, name):
                return event
        return None

    def _named_event(self, req: Request, namespace: str, name: str) -> tuple[int, Any]:
        """GET, or a merge PATCH (resourceVersion, when given, must match: else 409)."""
        stored = self._stored_event(namespace, name)
        if stored is None:
            return 404, not_found("events", name)
        if req.method == "GET":
            return 200, stored
        if req.method != "PATCH":
            return 405, status(405, "MethodNotAllowed", f"{req.method} is not supported here")
        patch = req.body or {}
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None:
            refused = write_refusal("PUT", "events", name, patch, stored)
            if refused is not None:
                return refused
        for key, value in patch.items():
            if key != "metadata":
                stored[key] = value
        stored["metadata"]["resourceVersion"] = self._bump()
        return 200, stored

    def _event(self, namespace: str, event: dict[str, Any]) -> tuple[int, Any]:
        meta = event["metadata"]
        meta.setdefault("name", f"{meta.get('generateName', '')}{next(self._names):05x}")
        taken = write_refusal("POST", "events", meta["name"], event,
                              self._stored_event(namespace, meta["name"]))  # fmt: skip
        if taken is not None:
            return taken
        meta["namespace"] = namespace
        involved = event.get("involvedObject") or {}
        theirs = involved.get("namespace") or ""
        # An Event lives beside its object; one about a cluster-scoped object (theirs "")
        # may only be in "default", as the API server's validation has it.
        if namespace != (theirs or "default"):
            return 422, invalid("Event", meta["name"], "involvedObject.namespace", theirs,
                                "does not match event.namespace")  # fmt: skip
        meta["resourceVersion"] = self._bump()
        self.events.append(event)
        return 201, event

    def _list(self, collection: str, query: Mapping[str, str]) -> tuple[int, Any]:
        """A list of one name (fieldSelector metadata.name): its resourceVersion is the
        server's current one, which a watch may start from, whatever the item's is."""
        selector = query.get("fieldSelector", "")
        if not selector.startswith("metadata.name="):
            return 400, status(400, "BadRequest", "the stand-in lists by metadata.name only")
        name = selector.removeprefix("metadata.name=")
        found = next((o for o in self._current(collection) if o["metadata"]["name"] == name), None)
        kind = "NodeList" if collection == NODES else "ConfigMapList"
        meta = {"resourceVersion": str(self.version)}
        return 200, {"kind": kind, "apiVersion": "v1", "metadata": meta,
                     "items": [found] if found else []}  # fmt: skip

    def _node_feature(self, req: Request, ns: str, name: str | None) -> tuple[int, Any]:
        qualified = "nodefeatures.nfd.k8s-sigs.io"
        if req.method == "GET":
            obj = self.features.get((ns, name or ""))
            return (200, obj) if obj else (404, not_found(qualified, name or ""))
        body = req.body
        key = (ns, body["metadata"]["name"])
        stored = self.features.get(key)
        refused = write_refusal(req.method, qualified, key[1], body, stored)
        if refused is not None:
            return refused
        body["metadata"]["resourceVersion"] = self._bump()
        self.features[key] = body
        return (201 if req.method == "POST" else 200), body

    async def _watch(self, req: Request, writer: asyncio.StreamWriter) -> None:
        collection = _collection(req.path)
        assert collection is not None
        if self.warming is not None and not self.warming.is_set():
            busy = status(429, "TooManyRequests", "storage is (re)initializing")
            return await self._reply(writer, req, 429, busy, headers="Retry-After: 1\r\n")
        since = req.query.get("resourceVersion")
        listing = req.query.get("sendInitialEvents") == "true"
        problem = list_problem(req.query)
        if problem is None and listing and isinstance(self.watch_lists_refused, int):
            code = self.watch_lists_refused
            problem = status(code, *REFUSALS.get(code, REFUSALS[500]))
        if problem is not None:
            return await self._reply(writer, req, problem["code"], problem)
        if since and not listing and int(since) < self.expired_below:
            gone = status(410, "Expired", "too old resource version")
            return await self._reply(writer, req, 410, gone)
        stream = self.watch_state.open(collection, req.query, self._current)
        if listing and self.watch_lists_refused == STORAGE:
            self.watch_state.refuse_list(stream)
        elif listing:
            self.watch_state.initial_end(stream, str(self.version))
        req.code = 200
        seconds = req.query.get("timeoutSeconds", "")
        timeout = int(seconds) / self.time_scale if seconds.isdigit() else None
        await self.watch_state.serve(stream, writer, self._changed, timeout)

    def _current(self, collection: str) -> list[dict[str, Any]]:
        if collection == NODES:
            return list(self.nodes.values())
        if collection == SLICES:
            return list(self.dra.slices.values())
        namespace = collection.split("/")[4]
        return [cm for (ns, _), cm in self.config_maps.items() if ns == namespace]


def _config_maps(namespace: str) -> str:
    return f"{NAMESPACES}{namespace}/configmaps"


def _collection(path: str) -> str | None:
    """The watchable collection `path` is (Nodes, a namespace's ConfigMaps,
    ResourceSlices), or None."""
    parts = path.strip("/").split("/")
    configmaps = len(parts) == 5 and path.startswith(NAMESPACES) and parts[4] == "configmaps"
    return path if path in (NODES, SLICES) or configmaps else None
