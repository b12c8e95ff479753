"""Ports: The Kubernetes API as the agent sees it: its Node, Events, labels' outputs."""

from __future__ import annotations

from collections.abc import (
    AsyncIterator,
    Mapping,
)
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ConfigMapView:
    """A ConfigMap as the agent follows it: its data (None: the ConfigMap does not exist)
    and annotations, and `trouble`: why this may be stale (the watch is failing and is
    being retried; this is the last view read), None while the watch works."""

    data: Mapping[str, str] | None
    annotations: Mapping[str, str] = field(default_factory=dict)
    trouble: str | None = None


class NodeApi(Protocol):
    """The agent's view of the Kubernetes API: its own Node, its NodeFeature, Events,
    and the ConfigMap of per-node configs when it is read through the API."""

    async def node_labels(self, node: str) -> dict[str, str]:
        """The Node's labels now (a full read). Raises BackendError(transient=True)
        when the API cannot be reached."""
        ...

    def watch_node_labels(self, node: str) -> AsyncIterator[dict[str, str]]:
        """Yield the Node's labels after the first full read, then each time they
        change; resumes (re-reading) after a dropped watch or 410 Gone."""
        ...

    def watch_config_map(self, namespace: str, name: str) -> AsyncIterator[ConfigMapView]:
        """Yield the ConfigMap after the first full read (raising BackendError when that
        fails), then each time it or its trouble changes; resumes as the Node watch does."""
        ...

    @property
    def watch_trouble(self) -> str | None:
        """Why watches followed now are down (they are retried; what they last said
        serves), one line; None while every watch holds."""
        ...

    async def publish_node_feature(
        self, node: str, namespace: str, labels: Mapping[str, str]
    ) -> bool:
        """Create or update NodeFeature nvidia-features-for-<node> with `labels`;
        False when the stored object already had exactly these labels."""
        ...

    async def record_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        """A Kubernetes Event on the Node (best effort: never raises)."""
        ...

    async def report_config_problem(
        self, namespace: str, name: str, reason: str, message: str
    ) -> bool:
        """A problem of the shared ConfigMap, reported once for the whole cluster (one
        Warning Event on it, which every node finding the same problem shares); False when
        it could not be reported (best effort: never raises)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class PodEvents(Protocol):
    """Events about a Pod, in the Pod's namespace (the memory-budget watchdog's)."""

    async def record_pod_event(
        self, namespace: str, pod: str, uid: str, reason: str, message: str, *, warning: bool
    ) -> None:
        """A Kubernetes Event on the Pod (best effort: never raises)."""
        ...


class LabelSink(Protocol):
    """Where node labels go: an NFD features.d file or a NodeFeature object."""

    async def publish(self, labels: Mapping[str, str]) -> bool:
        """Write `labels`; False when nothing changed and nothing was written."""
        ...

    async def remove(self) -> None: ...
