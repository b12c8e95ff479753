"""Test helpers for the Kubernetes adapter: the API server stand-in (re-exported from the
testing kit, gpuslice.testing.apiserver), a lightkube client for it, grants from the
agent's RBAC rules, and a helper to consume watches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Generic, TypeVar

from lightkube import AsyncClient, KubeConfig

from gpuslice.adapters.kube.rbac import RULES, Rule
from gpuslice.testing.apiserver import (
    NFD,
    NODES,
    TOKEN,
    WAIT_S,
    FakeApiServer,
    Grant,
    Request,
    write_kubeconfig,
)

T = TypeVar("T")

__all__ = [
    "FAST_BACKOFF",
    "NFD",
    "NODES",
    "TOKEN",
    "WAIT_S",
    "FakeApiServer",
    "Follower",
    "Following",
    "Grant",
    "Request",
    "fake_client",
    "grants",
    "write_kubeconfig",
]


def grants(
    namespace: str, rules: Iterable[Rule] = RULES, names: Mapping[str, str] | None = None
) -> list[Grant]:
    """What binding `rules` as documented grants an agent running in `namespace`; with
    `names` (flag -> value), a rule narrowed to an object covers the one named only."""
    return [
        Grant(
            group,
            frozenset(rule.resources),
            frozenset(rule.verbs),
            rule.namespace(namespace),
            frozenset({names[rule.named_by]}) if names and rule.named_by else frozenset(),
        )
        for rule in rules
        for group in rule.api_groups
    ]


class Following(Generic[T]):
    """Consumes an async iterator in a task so its yields can be awaited one at a time."""

    def __init__(self, source: AsyncIterator[T]) -> None:
        self._source = source
        self._items: asyncio.Queue[T] = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for item in self._source:
            self._items.put_nowait(item)

    async def next(self) -> T:
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


FAST_BACKOFF = (0.005, 0.05)  # seconds: keeps reconnect tests in milliseconds


def fake_client(url: str, directory: Path) -> AsyncClient:
    """A lightkube client for `url` through a kubeconfig file; it ignores proxy
    variables so 127.0.0.1 is always reached directly."""
    config = KubeConfig.from_file(write_kubeconfig(directory, url))
    return AsyncClient(config=config, trust_env=False)


class Follower(Following[dict[str, str]]):
    """Following a Node's labels."""
