"""MemoryNodeApi: the NodeApi port kept in memory, the cluster of tests and the demo.

It behaves like the Kubernetes adapter where the contract says so (first yield is
the full read, later yields only on change, a missing Node is {}, NodeFeature
written only when its labels change, Events best effort) and lets the caller play
the cluster: set_labels / delete_node and put_config_map / delete_config_map wake
watchers at once (each change in order, as watch events arrive), set_reachable(False)
makes reads and writes fail as an unreachable API server would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.adapters.kube import objects
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import ConfigMapView

_UNREACHABLE = "Kubernetes API unreachable (simulated)"


@dataclass(frozen=True)
class RecordedEvent:
    node: str
    reason: str
    message: str
    type: str  # objects.EVENT_NORMAL or objects.EVENT_WARNING


class MemoryNodeApi:
    """Nodes, NodeFeature objects and Events in dictionaries and lists.

    Inspect `node_features` ((namespace, name) -> object), `events` and `writes`
    (NodeFeature creates plus updates). While unreachable, node_labels and
    publish_node_feature raise BackendError(transient=True), Events are dropped,
    and watchers stay silent until reachable again, then catch up.
    """

    def __init__(self, nodes: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self._nodes = {node: dict(labels) for node, labels in (nodes or {}).items()}
        self._watchers: dict[str, list[asyncio.Queue[dict[str, str]]]] = {}
        self._maps: dict[tuple[str, str], ConfigMapView] = {}
        self._map_watchers: dict[tuple[str, str], list[asyncio.Queue[ConfigMapView]]] = {}
        self._reachable = True
        self.node_features: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[RecordedEvent] = []
        self.config_map_events: dict[tuple[str, str, str, str], int] = {}
        self.writes = 0

    # the cluster side

    def set_labels(self, node: str, labels: Mapping[str, str]) -> None:
        """Create or relabel a Node; watchers wake at once."""
        self._nodes[node] = dict(labels)
        self._notify(node)

    def delete_node(self, node: str) -> None:
        self._nodes.pop(node, None)
        self._notify(node)

    def put_config_map(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Create or replace a ConfigMap; its watchers wake at once."""
        self._maps[(namespace, name)] = ConfigMapView(dict(data), dict(annotations or {}))
        self._notify_map((namespace, name))

    def delete_config_map(self, namespace: str, name: str) -> None:
        self._maps.pop((namespace, name), None)
        self._notify_map((namespace, name))

    def set_reachable(self, reachable: bool) -> None:
        """While unreachable, Node watchers hear nothing and ConfigMap watchers hear
        that they are in trouble; back online they get the state of the moment (as a
        re-read would), not each change they missed."""
        was, self._reachable = self._reachable, reachable
        if reachable and not was:
            for node in self._watchers:
                self._notify(node)
        for key, queues in self._map_watchers.items():
            if reachable != was:
                for queue in queues:
                    queue.put_nowait(self._map_view(key))

    @property
    def reachable(self) -> bool:
        return self._reachable

    def node_feature_labels(self, node: str, namespace: str) -> dict[str, str] | None:
        """spec.labels of the stored NodeFeature for `node`, None when there is none."""
        stored = self.node_features.get((namespace, objects.node_feature_name(node)))
        return None if stored is None else objects.spec_labels(stored)

    # the NodeApi port

    @property
    def watch_trouble(self) -> str | None:
        watched = bool(self._watchers) or bool(self._map_watchers)
        return None if self._reachable or not watched else _UNREACHABLE

    async def node_labels(self, node: str) -> dict[str, str]:
        self._check(f"read node {node}")
        if node not in self._nodes:
            raise BackendError(f"node {node} not found in the Kubernetes API")
        return dict(self._nodes[node])

    async def watch_node_labels(self, node: str) -> AsyncGenerator[dict[str, str], None]:
        self._check(f"read node {node}")
        changes: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self._watchers.setdefault(node, []).append(changes)
        try:
            last = dict(self._nodes.get(node, {}))
            yield dict(last)
            while True:
                labels = await changes.get()
                if labels != last:
                    last = labels
                    yield dict(last)
        finally:
            self._watchers[node].remove(changes)

    async def watch_config_map(
        self, namespace: str, name: str
    ) -> AsyncGenerator[ConfigMapView, None]:
        key = (namespace, name)
        self._check(f"read ConfigMap {namespace}/{name}")
        changes: asyncio.Queue[ConfigMapView] = asyncio.Queue()
        self._map_watchers.setdefault(key, []).append(changes)
        try:
            last = self._map_view(key)
            yield last
            while True:
                view = await changes.get()
                if view != last:
                    last = view
                    yield last
        finally:
            self._map_watchers[key].remove(changes)

    async def publish_node_feature(
        self, node: str, namespace: str, labels: Mapping[str, str]
    ) -> bool:
        name = objects.node_feature_name(node)
        self._check(f"write NodeFeature {namespace}/{name}")
        stored = self.node_features.get((namespace, name))
        if stored is None:
            stored = objects.node_feature_body(node, namespace, labels)
        elif objects.holds(stored, labels):
            return False
        else:
            stored = objects.with_spec_labels(stored, labels)
        self.node_features[(namespace, name)] = stored
        self.writes += 1
        return True

    async def aclose(self) -> None:
        """Nothing to release; present so callers treat both APIs alike."""

    async def record_event(self, node: str, reason: str, message: str, *, warning: bool) -> None:
        if self._reachable:
            self.events.append(
                RecordedEvent(node, reason, message, objects.event_type(warning=warning))
            )

    async def report_config_problem(
        self, namespace: str, name: str, reason: str, message: str
    ) -> bool:
        """Kept in `config_map_events` ((namespace, name, reason, message) -> how many
        reports), one entry per problem, whichever nodes report it."""
        if not self._reachable:
            return False
        key = (namespace, name, reason, message)
        self.config_map_events[key] = self.config_map_events.get(key, 0) + 1
        return True

    def _check(self, what: str) -> None:
        if not self._reachable:
            raise BackendError(f"{what}: {_UNREACHABLE}", transient=True)

    def _notify(self, node: str) -> None:
        if not self._reachable:
            return
        for changes in self._watchers.get(node, ()):
            changes.put_nowait(dict(self._nodes.get(node, {})))

    def _map_view(self, key: tuple[str, str]) -> ConfigMapView:
        """What a watcher of `key` holds now: while unreachable, the last view with trouble."""
        view = self._maps.get(key, ConfigMapView(None))
        if self._reachable:
            return view
        return ConfigMapView(view.data, view.annotations, f"watch ConfigMap: {_UNREACHABLE}")

    def _notify_map(self, key: tuple[str, str]) -> None:
        if self._reachable:
            for changes in self._map_watchers.get(key, ()):
                changes.put_nowait(self._map_view(key))
