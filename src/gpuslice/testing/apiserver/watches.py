"""The watches of the API server stand-in: the history of changes and the open streams.

Every object lives in a collection (its list path: /api/v1/nodes,
/api/v1/namespaces/<ns>/configmaps, /apis/resource.k8s.io/v1/resourceslices); a watch
follows the objects of one collection its fieldSelector matches (metadata.name for one
object; spec.nodeName and spec.driver for ResourceSlices). A watch from a resourceVersion
replays the history after it; one without starts with the matching objects as ADDED. A
streaming list (sendInitialEvents=true) adds, after those, the BOOKMARK that marks the end
of the initial events (annotation INITIAL_EVENTS_END) at the current version; a server whose
storage cannot serve one (etcd 3.4: no RequestWatchProgress) answers it with 200, one ERROR
event (500 InternalError, REFUSED_WATCH_LIST) and the end, as the real watch cache does.
Each event is one JSON line of a chunked response.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuslice.testing.apiserver.status import status

END = "end"  # a clean end of the response, as on the server's timeout
DROP = "drop"  # the connection dies mid-stream
STORAGE = "storage"  # a streaming list refused by the storage (etcd 3.4): see refuse_list
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
REFUSED_WATCH_LIST = (
    "a watch stream was requested by the client but the required storage feature "
    "RequestWatchProgress is disabled"
)


def selector(text: str) -> dict[str, str]:
    """fieldSelector "a=b,c=d" as {a: b, c: d}."""
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def list_problem(query: dict[str, str]) -> dict[str, Any] | None:
    """422 for a watch whose streaming-list options do not go together (validation's
    rules: sendInitialEvents needs bookmarks and resourceVersionMatch NotOlderThan, and
    resourceVersionMatch needs sendInitialEvents), else None."""
    if query.get("sendInitialEvents") == "true":
        if query.get("allowWatchBookmarks") != "true":
            problem = "allowWatchBookmarks: Required value: sendInitialEvents needs bookmarks"
        elif query.get("resourceVersionMatch") != "NotOlderThan":
            problem = ("resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
                       "resourceVersionMatch to NotOlderThan")  # fmt: skip
        else:
            return None
    elif "resourceVersionMatch" in query:
        problem = ("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for "
                   "watch unless sendInitialEvents is provided")  # fmt: skip
    else:
        return None
    return status(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {problem}')


def matches(obj: dict[str, Any], wanted: dict[str, str]) -> bool:
    """`obj` has every field `wanted` names (metadata.name, spec.nodeName, spec.driver)."""
    spec = obj.get("spec") or {}
    fields = {"metadata.name": obj["metadata"]["name"], "spec.nodeName": spec.get("nodeName"),
              "spec.driver": spec.get("driver")}  # fmt: skip
    return all(fields.get(k) == v for k, v in wanted.items())


@dataclass
class Stream:
    collection: str
    wanted: dict[str, str]  # the fieldSelector
    bookmarks: bool
    queue: asyncio.Queue[bytes | str] = field(default_factory=asyncio.Queue)

    def send(self, event: dict[str, Any]) -> None:
        self.queue.put_nowait(json.dumps(event).encode() + b"\n")


@dataclass
class Watches:
    history: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)
    streams: list[Stream] = field(default_factory=list)

    def record(
        self, version: int, collection: str, kind: str, obj: dict[str, Any], notify: bool = True
    ) -> None:
        """A change at `version`; notify=False keeps it from open watches (events lost)."""
        self.history.append((version, collection, kind, obj))
        if notify:
            for stream in self.streams:
                if stream.collection == collection and matches(obj, stream.wanted):
                    stream.send({"type": kind, "object": obj})

    def bookmark(self, version: str) -> None:
        event = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version}}}
        for stream in self.streams:
            if stream.bookmarks:
                stream.send(event)

    def expire(self) -> None:
        """ERROR 410 on every open watch, then a clean end (what an API server does)."""
        event = {"type": "ERROR", "object": status(410, "Expired", "too old resource version")}
        for stream in self.streams:
            stream.send(event)
            stream.queue.put_nowait(END)

    def initial_end(self, stream: Stream, version: str) -> None:
        """The BOOKMARK closing a streaming list's initial events."""
        meta = {"resourceVersion": version, "annotations": {INITIAL_EVENTS_END: "true"}}
        stream.send({"type": "BOOKMARK", "object": {"metadata": meta}})

    @staticmethod
    def refuse_list(stream: Stream) -> None:
        """What a watch cache without RequestWatchProgress answers a streaming list."""
        refused = status(500, "InternalError", REFUSED_WATCH_LIST)
        stream.queue = asyncio.Queue()  # not the initial events: the error alone
        stream.send({"type": "ERROR", "object": refused})
        stream.queue.put_nowait(END)

    def cut(self, how: str) -> None:
        for stream in self.streams:
            stream.queue.put_nowait(how)

    def open(
        self,
        collection: str,
        query: dict[str, str],
        current: Callable[[str], list[dict[str, Any]]],
    ) -> Stream:
        """A new stream with what it starts with: the replay after its resourceVersion,
        or else the matching objects now (of current(collection)) as ADDED."""
        wanted = selector(query.get("fieldSelector", ""))
        stream = Stream(collection, wanted, query.get("allowWatchBookmarks") == "true")
        since = query.get("resourceVersion")
        if since and query.get("sendInitialEvents") != "true":
            for version, where, kind, obj in self.history:
                if version > int(since) and where == collection and matches(obj, wanted):
                    stream.send({"type": kind, "object": obj})
        else:
            for now in current(collection):
                if matches(now, wanted):
                    stream.send({"type": "ADDED", "object": now})
        return stream

    async def serve(
        self,
        stream: Stream,
        writer: asyncio.StreamWriter,
        changed: Callable[[], Any],
        timeout_s: float | None = None,
    ) -> None:
        """Answer 200 and stream until END, DROP or `timeout_s` (then a clean end, as the
        server's timeoutSeconds); `changed` is awaited as it opens and ends."""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        self.streams.append(stream)
        await changed()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        try:
            while True:
                left = None if deadline is None else max(deadline - loop.time(), 0.0)
                try:
                    item = await asyncio.wait_for(stream.queue.get(), left)
                except TimeoutError:
                    item = END
                if item == DROP:
                    writer.transport.abort()
                    return
                if item == END:
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    return
                assert isinstance(item, bytes)
                writer.write(f"{len(item):x}\r\n".encode() + item + b"\r\n")
                await writer.drain()
        finally:
            self.streams.remove(stream)
            await changed()
