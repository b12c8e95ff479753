"""The lightkube boundary: every request to the Kubernetes API, with errors made ours.

The only module that imports lightkube and httpx2 (lightkube's HTTP library). It is
imported when a KubeNodeApi is built, so runs without Kubernetes never load either.
Failures leave as BackendError (transient when a retry may help: unreachable, 5xx,
429, 409), NotFound or Conflict, each with a one-line message; the watch stream
raises WatchGone or WatchBroken instead.
"""

from __future__ import annotations

import contextlib
import random
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx2
import msgspec
from lightkube import ALL_NS, AsyncClient, KubeConfig
from lightkube.config.client_adapter import user_auth, verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.config.models import User
from lightkube.core.exceptions import ApiError
from lightkube.core.exceptions import ConfigError as KubeConfigError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod
from lightkube.types import PatchType

from gpuslice.adapters.kube import objects
from gpuslice.adapters.kube.bounded import BoundedTransport, bounded_transport
from gpuslice.adapters.kube.watch import (
    OPENED,
    SYNCED,
    WATCH_TIMEOUT_S,
    FullRead,
    NodeLabels,
    Unreachable,
    WatchBroken,
    WatchEvent,
    WatchGone,
)
from gpuslice.config.yaml_text import YAMLError
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import ConfigMapView

T = TypeVar("T")
R = TypeVar("R", bound="msgspec.Struct")

NodeFeature = create_namespaced_resource(
    objects.NFD_GROUP, objects.NFD_VERSION, objects.NODE_FEATURE_KIND, objects.NODE_FEATURE_PLURAL
)

# DRA (resource.k8s.io/v1), as generic objects: they are sent and read as plain JSON.
ResourceSlice = create_global_resource(objects.DRA_GROUP, "v1", "ResourceSlice", "resourceslices")
ResourceClaim = create_namespaced_resource(
    objects.DRA_GROUP, "v1", "ResourceClaim", "resourceclaims"
)


class NotFound(BackendError):  # noqa: N818 - the HTTP term
    """HTTP 404."""


class Conflict(BackendError):  # noqa: N818 - the HTTP term
    """HTTP 409: the object appeared or changed since it was read."""


def make_client(kubeconfig: str | None) -> AsyncClient:
    """A client from a kubeconfig file, or else in-cluster / $KUBECONFIG / ~/.kube/config."""
    source = (
        f"--kubeconfig (KUBECONFIG) {kubeconfig}"
        if kubeconfig
        else "Kubernetes config (in-cluster service account, $KUBECONFIG or ~/.kube/config)"
    )
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
        single = config.get()
        if single is None:
            raise KubeConfigError("no current context")
        return KubeClient(single)
    except (
        KubeConfigError,
        KeyError,
        TypeError,
        ValueError,
        AttributeError,  # a YAML document that is not a mapping
        OSError,
        YAMLError,
        httpx2.InvalidURL,  # a malformed server URL
    ) as exc:
        why = f"no {exc} entry" if isinstance(exc, KeyError) else _one_line(exc)
        raise BackendError(f"{source}: not a usable kubeconfig: {why}") from exc


class KubeClient(AsyncClient):
    """lightkube's client built with the bounded transport (adapters.kube.bounded), and an
    httpx2 client over the same transport, `http`, for what lightkube cannot ask (watches
    with bookmarks, reviews); closing it closes both."""

    def __init__(self, config: SingleConfig) -> None:
        transport = bounded_transport(config)
        super().__init__(config=config, field_manager=objects.COMPONENT, transport=transport)
        self.http = _http_client(config, transport)

    async def close(self) -> None:
        await super().close()
        await self.http.aclose()


def _http_client(config: SingleConfig, transport: httpx2.AsyncBaseTransport) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        base_url=config.cluster.server,
        auth=user_auth(config.user),
        timeout=httpx2.Timeout(10.0),
        transport=transport,
    )


class ApiSession:
    """The handful of API calls the agent makes, over one lightkube AsyncClient."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
        rand: random.Random | None = None,
    ) -> None:
        self._client = client
        self._watch_timeout_s = watch_timeout_s
        self._rand = rand or random.Random()  # noqa: S311 - jitter, not secrecy
        # lightkube's public watch() cannot ask for bookmarks, so the watch goes through
        # an httpx2 client: the KubeClient's own, else one per use (a client built by the
        # caller: no environment proxies, as those built for tests ask).
        self._http = client.http if isinstance(client, KubeClient) else None
        self._ssl: ssl.SSLContext | None = None  # for the clients made per use
        self.server = str(client.config.cluster.server)

    async def read_node(self, node: str) -> tuple[NodeLabels, str | None]:
        """The Node's labels and resourceVersion, and its uid. Raises NotFound."""
        with self._errors(f"read node {node}"):
            obj = await self._client.get(Node, node)
        meta = obj.metadata or ObjectMeta()
        return NodeLabels(dict(meta.labels or {}), meta.resourceVersion), meta.uid

    def watch_node(
        self, node: str, version: str | None, streaming: bool = True
    ) -> AsyncGenerator[WatchEvent[dict[str, str]], None]:
        """One watch request on the Node, from `version` (None: from now, as a streaming
        list with `streaming`); ends when the server ends it."""
        return self._watch("api/v1/nodes", f"node {node}", f"metadata.name={node}", version,
                           _labels, streaming=streaming)  # fmt: skip

    async def read_config_map(
        self, namespace: str, name: str
    ) -> tuple[FullRead[ConfigMapView], str | None]:
        """The ConfigMap's data and annotations, and its resourceVersion; its uid.
        Raises NotFound."""
        with self._errors(f"read ConfigMap {namespace}/{name}"):
            obj = await self._client.get(ConfigMap, name, namespace=namespace)
        meta = obj.metadata or ObjectMeta()
        view = ConfigMapView(dict(obj.data or {}), dict(meta.annotations or {}))
        return FullRead(view, meta.resourceVersion), meta.uid

    def watch_config_map(
        self, namespace: str, name: str, version: str | None, streaming: bool = True
    ) -> AsyncGenerator[WatchEvent[ConfigMapView], None]:
        """One watch request on the ConfigMap, as watch_node."""
        path = f"api/v1/namespaces/{namespace}/configmaps"
        what = f"ConfigMap {namespace}/{name}"
        fields = f"metadata.name={name}"
        return self._watch(path, what, fields, version, _config_map, streaming=streaming)

    def watch_slices(self, node: str, driver: str) -> AsyncGenerator[WatchEvent[str], None]:
        """One watch request on this node's ResourceSlices of `driver`, from now: the
        slices there as ADDED, then their changes; each event's value is the slice's name."""
        fields = f"spec.nodeName={node},spec.driver={driver}"
        path = f"apis/{objects.DRA_GROUP}/v1/resourceslices"
        what = f"ResourceSlices of node {node}"
        return self._watch(path, what, fields, None, _name, streaming=False)

    async def _watch(
        self,
        path: str,
        what: str,
        fields: str,
        version: str | None,
        project: Callable[[_Object], T],
        *,
        streaming: bool,
    ) -> AsyncGenerator[WatchEvent[T], None]:
        """One watch request on the objects of the collection at `path` that the field
        selector `fields` matches: OPENED once the server answered, then its events until
        the server ends the watch. From now (`version` None): the objects as ADDED first;
        with `streaming`, as a streaming list (sendInitialEvents), whose initial events
        end with SYNCED."""
        # Each watch asks for its own timeout, so a fleet's watches do not all end (and
        # re-open) together, as client-go's reflector does it.
        seconds = self._rand.randint(*self._watch_timeout_s)
        params = {
            "watch": "true",
            "fieldSelector": fields,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(seconds),
        }
        if version:
            params["resourceVersion"] = version
        elif streaming:
            params["sendInitialEvents"] = "true"
            params["resourceVersionMatch"] = "NotOlderThan"
        # The server ends the watch after timeoutSeconds; longer silence means a dead link.
        timeout = httpx2.Timeout(10.0, read=seconds + 30.0)
        try:
            async with (
                self._http_client() as http,
                http.stream("GET", path, params=params, timeout=timeout) as resp,
            ):
                if resp.status_code != 200:
                    await resp.aread()
                    raise _watch_failure(resp.status_code, _status_message(resp.content))
                yield WatchEvent(OPENED, project(_Object()), None)
                async for line in _lines(resp.aiter_bytes(), MAX_EVENT_BYTES):
                    yield _decode_event(line, project)
        except httpx2.HTTPError as exc:  # transport, or a body that does not decode
            unreachable = isinstance(exc, httpx2.TransportError)
            raise WatchBroken(f"watch {what}: {_one_line(exc)}", unreachable=unreachable) from exc

    async def get_node_feature(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            with self._errors(f"read NodeFeature {namespace}/{name}"):
                obj = await self._client.get(NodeFeature, name, namespace=namespace)
        except NotFound:
            return None
        return dict(obj)

    async def create_node_feature(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        with self._errors(f"create NodeFeature {namespace}/{name}"):
            await self._client.create(NodeFeature(**body))

    async def replace_node_feature(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        with self._errors(f"update NodeFeature {namespace}/{name}"):
            await self._client.replace(NodeFeature(**body))

    async def pod_owners(self, namespace: str, pod: str) -> list[objects.OwnerRef]:
        """The owners a NodeFeature gets from the agent's Pod (objects.daemonset_owners).
        Raises NotFound when there is no such Pod."""
        with self._errors(f"read pod {namespace}/{pod}"):
            obj = await self._client.get(Pod, pod, namespace=namespace)
        meta = obj.metadata or ObjectMeta()
        refs = [
            {"apiVersion": ref.apiVersion, "kind": ref.kind, "name": ref.name, "uid": ref.uid}
            for ref in meta.ownerReferences or ()
        ]
        return objects.daemonset_owners(pod, meta.uid or "", refs)

    async def create_event(
        self, namespace: str, node: str, uid: str | None, reason: str, message: str, kind: str
    ) -> None:
        meta = ObjectMeta(generateName=f"{node}.", namespace=namespace)
        about = ObjectReference(apiVersion="v1", kind="Node", name=node, uid=uid)
        with self._errors(f"record event {reason} on node {node}"):
            await self._client.create(_event(meta, about, reason, message, kind, node))

    async def create_pod_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, kind: str, host: str
    ) -> None:
        meta = ObjectMeta(generateName=f"{pod}.", namespace=namespace)
        about = ObjectReference(
            apiVersion="v1", kind="Pod", name=pod, namespace=namespace, uid=uid or None
        )
        with self._errors(f"record event {reason} on pod {namespace}/{pod}"):
            await self._client.create(_event(meta, about, reason, message, kind, host))

    async def read_event(self, namespace: str, name: str) -> tuple[int, datetime | None, str]:
        """An Event's count, lastTimestamp and resourceVersion. Raises NotFound."""
        with self._errors(f"read event {namespace}/{name}"):
            obj = await self._client.get(Event, name, namespace=namespace)
        meta = obj.metadata or ObjectMeta()
        return obj.count or 1, obj.lastTimestamp, meta.resourceVersion or ""

    async def create_config_map_event(
        self, namespace: str, config_map: str, uid: str | None, name: str, reason: str,
        message: str, host: str,
    ) -> None:  # fmt: skip
        """A Warning Event named `name` about the ConfigMap. Raises Conflict when it
        exists."""
        meta = ObjectMeta(name=name, namespace=namespace)
        about = ObjectReference(
            apiVersion="v1", kind="ConfigMap", name=config_map, namespace=namespace, uid=uid
        )
        event = _event(meta, about, reason, message, objects.EVENT_WARNING, host)
        with self._errors(f"record event {reason} on ConfigMap {namespace}/{config_map}"):
            await self._client.create(event)

    async def bump_event(self, namespace: str, name: str, count: int, version: str) -> None:
        """Set an Event's count and lastTimestamp (now), if it is still at `version`:
        Conflict when another node bumped it first."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {"metadata": {"resourceVersion": version}, "count": count, "lastTimestamp": now}
        with self._errors(f"update event {namespace}/{name}"):
            await self._client.patch(
                Event, name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """A ResourceClaim as JSON. Raises NotFound."""
        with self._errors(f"read ResourceClaim {namespace}/{name}"):
            obj = await self._client.get(ResourceClaim, name, namespace=namespace)
        return dict(obj)

    async def list_claims(self, page: int) -> AsyncIterator[dict[str, Any]]:
        """Every ResourceClaim (all namespaces), read `page` at a time."""
        with self._errors("list ResourceClaims"):
            async for obj in self._client.list(ResourceClaim, namespace=ALL_NS, chunk_size=page):
                yield dict(obj)

    async def list_slices(self, node: str, driver: str) -> list[dict[str, Any]]:
        fields: dict[str, Any] = {"spec.nodeName": node, "spec.driver": driver}
        with self._errors(f"list ResourceSlices of node {node}"):
            return [dict(s) async for s in self._client.list(ResourceSlice, fields=fields)]

    async def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._errors(f"create ResourceSlice {body['metadata']['name']}"):
            return dict(await self._client.create(ResourceSlice(**body)))

    async def replace_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._errors(f"update ResourceSlice {body['metadata']['name']}"):
            return dict(await self._client.replace(ResourceSlice(**body)))

    async def delete_slice(self, name: str) -> None:
        """Raises NotFound."""
        with self._errors(f"delete ResourceSlice {name}"):
            await self._client.delete(ResourceSlice, name)

    async def review_token(self, token: str, timeout_s: float) -> objects.Identity | None:
        """Whom `token` authenticates (a TokenReview); None when it authenticates no one."""
        body = {"apiVersion": f"{objects.AUTHN_GROUP}/v1", "kind": "TokenReview",
                "spec": {"token": token}}  # fmt: skip
        path = f"apis/{objects.AUTHN_GROUP}/v1/tokenreviews"
        answer = await self._review(path, body, "review a bearer token", timeout_s, _TokenReview)
        status = answer.status
        if not status.authenticated or not status.user.username:
            return None
        user = status.user
        return objects.Identity(user.username, user.uid, tuple(user.groups), user.extra)

    async def review_access(
        self, who: objects.Identity, path: str, verb: str, timeout_s: float
    ) -> tuple[bool, str]:
        """Whether `who` may `verb` the non-resource URL `path` (a SubjectAccessReview),
        and the authorizer's reason."""
        spec: dict[str, Any] = {"user": who.user, "groups": list(who.groups),
                                "nonResourceAttributes": {"path": path, "verb": verb}}  # fmt: skip
        if who.uid:
            spec["uid"] = who.uid
        if who.extra:
            spec["extra"] = {k: list(v) for k, v in who.extra.items()}
        body = {"apiVersion": f"{objects.AUTHZ_GROUP}/v1", "kind": "SubjectAccessReview",
                "spec": spec}  # fmt: skip
        url = f"apis/{objects.AUTHZ_GROUP}/v1/subjectaccessreviews"
        answer = await self._review(url, body, f"review access to {path}", timeout_s, _AccessReview)
        return answer.status.allowed and not answer.status.denied, answer.status.reason

    async def _review(
        self, path: str, body: dict[str, Any], what: str, timeout_s: float, kind: type[R]
    ) -> R:
        with self._errors(what):
            async with self._http_client() as http:
                resp = await http.post(path, json=body, timeout=httpx2.Timeout(timeout_s))
            if resp.status_code != 201 and resp.status_code != 200:
                message = _status_message(resp.content)
                text = f"{what}: HTTP {resp.status_code}: {_one_line(message)}"
                raise BackendError(text, transient=True)
            return msgspec.json.decode(resp.content, type=kind)

    async def aclose(self) -> None:
        await self._client.close()

    @contextlib.asynccontextmanager
    async def _http_client(self) -> AsyncIterator[httpx2.AsyncClient]:
        if self._http is not None:
            yield self._http
            return
        config = self._client.config
        inner = httpx2.AsyncHTTPTransport(verify=self._verify(config))
        async with _http_client(config, BoundedTransport(inner)) as http:
            yield http

    def _verify(self, config: SingleConfig) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = verify_cluster(config.cluster, config.user or User(), config.abs_file)
        return self._ssl

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except httpx2.TransportError as exc:
            raise Unreachable(
                f"{what}: Kubernetes API at {self.server} unreachable: {_one_line(exc)}"
            ) from exc
        except httpx2.HTTPStatusError as exc:
            code = exc.response.status_code
            message = exc.status.message if isinstance(exc, ApiError) else None
            text = f"{what}: HTTP {code}: {_one_line(message or exc.response.reason_phrase)}"
            if code == 404:
                raise NotFound(text) from exc
            if code == 409:
                raise Conflict(text, transient=True) from exc
            raise BackendError(text, transient=code >= 500 or code == 429) from exc
        except httpx2.HTTPError as exc:  # a body that does not decode (bad gzip, bad chunks)
            raise BackendError(
                f"{what}: unreadable answer from {self.server}: {_one_line(exc)}", transient=True
            ) from exc
        except msgspec.DecodeError as exc:  # not JSON, or not what lightkube's models hold
            raise BackendError(
                f"{what}: unexpected answer: {_one_line(exc)}", transient=True
            ) from exc


class _Meta(msgspec.Struct, rename="camel"):
    name: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    resource_version: str | None = None


INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the annotation of a streaming list's end


class _Object(msgspec.Struct):
    """A Node or ConfigMap (the parts read) or, in ERROR events, a Status (code, message)."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    data: dict[str, str] | None = None
    code: int | None = None
    message: str | None = None


def _name(obj: _Object) -> str:
    return obj.metadata.name or ""


def _labels(obj: _Object) -> dict[str, str]:
    return dict(obj.metadata.labels or {})


def _config_map(obj: _Object) -> ConfigMapView:
    return ConfigMapView(dict(obj.data or {}), dict(obj.metadata.annotations or {}))


class _Event(msgspec.Struct):
    type: str
    object: _Object


# One watch event is one object: a ConfigMap holds at most 1 MiB, which JSON escaping
# may grow a few times. A longer line is a broken watch, not a reason to grow.
MAX_EVENT_BYTES = 16 * 1024 * 1024


async def _lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """The non-blank lines of a byte stream; WatchBroken for one longer than `limit`."""
    line = bytearray()
    async for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line += chunk[start:end]
            start = end + 1
            if len(line) > limit:
                break
            if line.strip():
                yield bytes(line)
            line.clear()
        line += chunk[start:]
        if len(line) > limit:
            raise WatchBroken(f"watch event over {limit} bytes")
    if line.strip():
        yield bytes(line)


def _decode_event(line: bytes, project: Callable[[_Object], T]) -> WatchEvent[T]:
    try:
        event = msgspec.json.decode(line, type=_Event)
    except msgspec.DecodeError as exc:
        raise WatchBroken(f"undecodable watch event: {_one_line(exc)}") from exc
    obj = event.object
    if event.type == "ERROR":
        raise _watch_failure(obj.code or 0, obj.message or "")
    kind = event.type
    if kind == "BOOKMARK" and (obj.metadata.annotations or {}).get(INITIAL_EVENTS_END) == "true":
        kind = SYNCED
    return WatchEvent(kind, project(obj), obj.metadata.resource_version)


def _watch_failure(code: int, message: str) -> Exception:
    text = f"watch: HTTP {code}: {_one_line(message)}"
    return WatchGone(text) if code == 410 else WatchBroken(text, code=code)


def _status_message(body: bytes) -> str:
    try:
        return msgspec.json.decode(body, type=_Object).message or ""
    except msgspec.DecodeError:
        return body[:200].decode("utf-8", "replace")


def _one_line(exc: object) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class _UserInfo(msgspec.Struct):
    username: str = ""
    uid: str = ""
    groups: list[str] = msgspec.field(default_factory=list)
    extra: dict[str, list[str]] = msgspec.field(default_factory=dict)


class _TokenStatus(msgspec.Struct):
    authenticated: bool = False
    user: _UserInfo = msgspec.field(default_factory=_UserInfo)


class _TokenReview(msgspec.Struct):
    status: _TokenStatus = msgspec.field(default_factory=_TokenStatus)


class _AccessStatus(msgspec.Struct):
    allowed: bool = False
    denied: bool = False
    reason: str = ""


class _AccessReview(msgspec.Struct):
    status: _AccessStatus = msgspec.field(default_factory=_AccessStatus)


def _event(
    meta: ObjectMeta, about: ObjectReference, reason: str, message: str, kind: str, host: str
) -> Event:
    """A new Event (count 1, first and last seen now) reported by the agent on `host`."""
    now = datetime.now(UTC)
    return Event(
        metadata=meta,
        involvedObject=about,
        reason=reason,
        message=message,
        type=kind,
        count=1,
        firstTimestamp=now,
        lastTimestamp=now,
        source=EventSource(component=objects.COMPONENT, host=host or None),
        reportingComponent=objects.COMPONENT,
        reportingInstance=host or objects.COMPONENT,
    )
