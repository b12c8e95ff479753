"""SlicePublisher: this node's ResourceSlices in the API, in step with what DRA serves.

One pool named after the node. On its first publish it reads the slices already there
(an earlier agent's) and continues their generation; every change of the published
devices bumps the generation and replaces every slice of the pool (the scheduler uses
only the newest generation of a pool), and slices left over from a larger pool are
deleted. A failed write is retried by the front-end; until then `pending` is set.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import structlog

from gpuslice.core.dra.devices import DraOptions, Json
from gpuslice.core.dra.slices import build_slices
from gpuslice.core.ports import DraApi

log = structlog.get_logger("gpuslice.dra")


class SlicePublisher:
    def __init__(self, api: DraApi, *, node: str, opts: DraOptions) -> None:
        self._api = api
        self.node = node
        self.opts = opts
        self.generation = 0
        self.slices: list[Json] = []  # as last published
        self._entries: list[Json] | None = None  # the devices last published
        self._stored: dict[str, dict[str, object]] | None = None  # name -> stored object
        self.pending = True  # what should be published is not (yet)
        self.last_publish_s = 0.0  # how long the last publish took

    async def publish(self, entries: Sequence[Json]) -> bool:
        """Publish `entries` (the devices) unless they already are; True when it wrote.
        Raises BackendError, leaving `pending` set."""
        wanted = list(entries)
        if wanted == self._entries and not self.pending:
            return False
        self.pending = True
        started = time.monotonic()
        if self._stored is None:
            found = await self._api.list_slices(self.node, self.opts.driver)
            self._stored = {_name(s): s for s in found}
            self.generation = max((_generation(s) for s in found), default=0)
        slices = build_slices(
            wanted, node=self.node, opts=self.opts, generation=self.generation + 1
        )
        stored = dict(self._stored)
        try:
            for body in slices:
                name = _name(body)
                stored[name] = await self._api.put_slice(body, stored.get(name))
            for name in sorted(set(stored) - {_name(s) for s in slices}):
                await self._api.delete_slice(name)
                del stored[name]
        except BaseException:
            self._stored = None  # re-read before the next try: what was written is unknown
            raise
        self._stored = stored
        self.generation += 1
        self.slices, self._entries, self.pending = slices, wanted, False
        self.last_publish_s = time.monotonic() - started
        log.info("dra_slices_published", node=self.node, generation=self.generation,
                 slices=len(slices), devices=len(wanted))  # fmt: skip
        return True

    async def withdraw(self) -> None:
        """Delete every slice of the pool (the driver stops serving this node)."""
        found = await self._api.list_slices(self.node, self.opts.driver)
        for s in found:
            await self._api.delete_slice(_name(s))
        self._stored, self._entries, self.pending = None, None, True


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _generation(obj: dict[str, Any]) -> int:
    pool = obj.get("spec", {}).get("pool", {})
    value = pool.get("generation", 0)
    return value if isinstance(value, int) else 0
