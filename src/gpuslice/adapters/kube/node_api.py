"""KubeNodeApi: the NodeApi port over the real Kubernetes API (through lightkube).

lightkube is imported when an instance is built, not when this module is, so
`gpuslice run` without Kubernetes never pays for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from gpuslice.adapters.kube import objects
from gpuslice.adapters.kube.published import Published
from gpuslice.adapters.kube.watch import (
    PROBE_CAP_S,
    WATCH_TIMEOUT_S,
    FullRead,
    NodeLabels,
    Retry,
    Watched,
    follow,
    labels_of,
)
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import ConfigMapView

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from gpuslice.adapters.kube.metrics_auth import MetricsAuth
    from gpuslice.adapters.kube.session import ApiSession

_log = structlog.get_logger()

T = TypeVar("T")
_WRITE_ATTEMPTS = 3  # a 409 (changed meanwhile) is retried from a fresh read
# A shared problem's Event found this old is bumped, so it shows as still current.
REPORT_AGAIN_S = 600.0


class KubeNodeApi:
    """The agent's Node, its NodeFeature, its Events and the ConfigMap of per-node configs
    (when read through the API), over one lightkube AsyncClient.

    `client` is used as given (tests inject one); otherwise one is built from
    `kubeconfig`, or from the in-cluster service account ($KUBECONFIG and
    ~/.kube/config as fallbacks). `pod_name` (the agent's own Pod, in the
    NodeFeature's namespace) gives a NodeFeature it creates owner references, as
    upstream: the Pod's DaemonSet (as controller) and the Pod, so deleting the DaemonSet
    garbage-collects it; none when no DaemonSet owns the Pod or the Pod cannot be read.
    Node Events go to namespace default, the only one the API server accepts them in.
    A NodeFeature it wrote is not read again while the labels it holds are wanted, but
    re-checked every `recheck_s` (a jittered range; `clock` and `rand` are injectable).
    Raises BackendError when no usable Kubernetes config is found.
    """

    def __init__(
        self,
        client: AsyncClient | None = None,
        *,
        kubeconfig: str | None = None,
        pod_name: str | None = None,
        host: str = "",  # the node's name, as the source of Pod events
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
        backoff_s: tuple[float, float] = (0.2, 30.0),
        probe_cap_s: float = PROBE_CAP_S,
        recheck_s: tuple[float, float] = (600.0, 1200.0),
        clock: Callable[[], float] = time.monotonic,
        rand: random.Random | None = None,
    ) -> None:
        from gpuslice.adapters.kube.session import ApiSession, make_client

        self._rand = rand or random.Random()  # noqa: S311 - jitter, not secrecy
        self._session: ApiSession = ApiSession(
            client if client is not None else make_client(kubeconfig),
            watch_timeout_s=watch_timeout_s,
            rand=self._rand,
        )
        self._published = Published(clock, lambda: self._rand.uniform(*recheck_s))
        self._trouble: dict[str, str] = {}  # what is watched -> why its watch is down
        self._owns_client = client is None
        self._pod_name = pod_name
        self._host = host
        self._backoff_s = backoff_s
        self._probe_cap_s = probe_cap_s
        self._uids: dict[str, str] = {}
        self._config_map_uids: dict[tuple[str, str], str] = {}
        self._owners: dict[str, list[objects.OwnerRef]] = {}

    @property
    def server(self) -> str:
        return self._session.server

    def metrics_auth(self, **limits: Any) -> MetricsAuth:
        """The bearer-token check of /metrics over this API's session (`limits`: its
        cache, concurrency and timeout, as MetricsAuth takes them)."""
        from gpuslice.adapters.kube.metrics_auth import MetricsAuth

        return MetricsAuth(self._session, **limits)

    @property
    def watch_trouble(self) -> str | None:
        """Why watches are down now (retried; what they last said serves), None while all
        hold."""
        if not self._trouble:
            return None
        return "; ".join(f"watch of {what} down: {why}" for what, why in self._trouble.items())

    async def aclose(self) -> None:
        """Close the HTTP client when this object built it."""
        if self._owns_client:
            await self._session.aclose()

    async def node_labels(self, node: str) -> dict[str, str]:
        from gpuslice.adapters.kube.session import NotFound

        try:
            state = await self._read(node)
        except NotFound as exc:
            raise BackendError(f"node {node} not found in the Kubernetes API") from exc
        return state.value

    def watch_node_labels(self, node: str) -> AsyncGenerator[dict[str, str], None]:
        from gpuslice.adapters.kube.session import NotFound

        async def read() -> NodeLabels:
            try:
                return await self._read(node)
            except NotFound:
                return NodeLabels({}, None)  # watched from "now": its creation shows up

        nothing: dict[str, str] = {}
        labels = follow(
            Watched("node", node),
            read,
            lambda version, streaming: self._session.watch_node(node, version, streaming),
            self._retry(),
            nothing,
        )
        return labels_of(self._tracked(f"Node {node}", labels))

    async def watch_config_map(
        self, namespace: str, name: str
    ) -> AsyncGenerator[ConfigMapView, None]:
        from gpuslice.adapters.kube.session import NotFound

        async def read() -> FullRead[ConfigMapView]:
            try:
                state, uid = await self._session.read_config_map(namespace, name)
            except NotFound:
                self._config_map_uids.pop((namespace, name), None)
                return FullRead(ConfigMapView(None), None)  # watched from "now"
            if uid:
                self._config_map_uids[(namespace, name)] = uid
            return state

        views = follow(
            Watched("configmap", f"{namespace}/{name}"),
            read,
            lambda version, streaming: self._session.watch_config_map(
                namespace, name, version, streaming
            ),
            self._retry(),
            ConfigMapView(None),
        )
        async with contextlib.aclosing(views):
            async for view, trouble in self._tracked(f"ConfigMap {namespace}/{name}", views):
                yield dataclasses.replace(view, trouble=trouble)

    def _retry(self) -> Retry:
        return Retry(*self._backoff_s, probe_cap_s=self._probe_cap_s, rand=self._rand)

    async def _tracked(
        self, what: str, items: AsyncGenerator[tuple[T, str | None], None]
    ) -> AsyncGenerator[tuple[T, str | None], None]:
        """`items`, with their trouble kept for watch_trouble while they are followed."""
        try:
            async with contextlib.aclosing(items):
                async for value, trouble in items:
                    if trouble is None:
                        self._trouble.pop(what, None)
                    else:
                        self._trouble[what] = trouble
                    yield value, trouble
        finally:
            self._trouble.pop(what, None)

    async def publish_node_feature(
        self, node: str, namespace: str, labels: Mapping[str, str]
    ) -> bool:
        from gpuslice.adapters.kube.session import Conflict

        key = (namespace, node)
        if self._published.holds(key, labels):
            return False  # this agent wrote them, and the re-check is not due
        attempts_left = _WRITE_ATTEMPTS
        while True:
            try:
                written = await self._write_node_feature(node, namespace, dict(labels))
            except Conflict:
                attempts_left -= 1
                if attempts_left == 0:
                    self._published.forget(key)
                    raise
            except BackendError:
                self._published.forget(key)
                raise
            else:
                self._published.hold(key, labels)
                return written

    async def record_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        kind = objects.event_type(warning=warning)
        try:
            await self._session.create_event(
                objects.NODE_EVENT_NAMESPACE, node, self._uids.get(node), reason, message, kind
            )
        except Exception as exc:  # best effort by contract: an Event must never stop the agent
            _log.warning("node_event_failed", node=node, reason=reason, error=str(exc))

    async def report_config_problem(
        self, namespace: str, name: str, reason: str, message: str
    ) -> bool:
        """A problem of the shared ConfigMap, as one Warning Event on it for the whole
        cluster: named after the problem (objects.shared_event_name), created by the first
        node to find it, and bumped (count, lastTimestamp) by a node that finds it again
        once the Event is REPORT_AGAIN_S old; left alone otherwise. False when it could not
        be reported (best effort: never raises)."""
        from gpuslice.adapters.kube.session import Conflict, NotFound

        event = objects.shared_event_name(name, reason, message)
        uid = self._config_map_uids.get((namespace, name))
        try:
            try:
                count, last, version = await self._session.read_event(namespace, event)
            except NotFound:
                with contextlib.suppress(Conflict):  # another node created it meanwhile
                    await self._session.create_config_map_event(
                        namespace, name, uid, event, reason, message, self._host
                    )
                return True
            age = (datetime.now(UTC) - last).total_seconds() if last else REPORT_AGAIN_S
            if age >= REPORT_AGAIN_S:
                with contextlib.suppress(Conflict):  # another node bumped it meanwhile
                    await self._session.bump_event(namespace, event, count + 1, version)
        except Exception as exc:  # best effort, as Node events
            _log.warning(
                "config_map_event_failed",
                config_map=f"{namespace}/{name}", reason=reason, error=str(exc),
            )  # fmt: skip
            return False
        return True

    async def record_pod_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, *, warning: bool
    ) -> None:
        kind = objects.event_type(warning=warning)
        try:
            await self._session.create_pod_event(
                namespace, pod, uid, reason, message, kind, self._host
            )
        except Exception as exc:  # best effort, as Node events
            _log.warning(
                "pod_event_failed", pod=f"{namespace}/{pod}", reason=reason, error=str(exc)
            )

    async def _write_node_feature(self, node: str, namespace: str, wanted: dict[str, str]) -> bool:
        from gpuslice.adapters.kube.session import NotFound

        name = objects.node_feature_name(node)
        stored = await self._session.get_node_feature(namespace, name)
        if stored is None:
            owners = await self._owner_refs(namespace)
            body = objects.node_feature_body(node, namespace, wanted, owners)
            try:
                await self._session.create_node_feature(namespace, body)
            except NotFound as exc:  # the object was absent, so the kind is unknown
                raise NotFound(f"{exc} (is NFD installed? no NodeFeature CRD found)") from exc
        elif objects.holds(stored, wanted):
            return False
        else:
            await self._session.replace_node_feature(
                namespace, objects.with_spec_labels(stored, wanted)
            )
        _log.info("node_feature_written", node=node, name=name, labels=len(wanted))
        return True

    async def _read(self, node: str) -> NodeLabels:
        state, uid = await self._session.read_node(node)
        if uid:
            self._uids[node] = uid
        return state

    async def _owner_refs(self, namespace: str) -> list[objects.OwnerRef]:
        """Looked up once per namespace. A Pod that cannot be read (missing, forbidden)
        means no owners and one warning; a transient failure propagates, so the write is
        retried with the owners it should have."""
        if self._pod_name is None:
            return []
        if namespace not in self._owners:
            try:
                owners = await self._session.pod_owners(namespace, self._pod_name)
            except BackendError as exc:
                if exc.transient:
                    raise
                _log.warning("node_feature_no_owner", pod=self._pod_name, error=str(exc))
                owners = []
            self._owners[namespace] = owners
        return self._owners[namespace]
