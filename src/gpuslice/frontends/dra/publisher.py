"""SlicePublisher: this node's ResourceSlices in the API, kept equal to what DRA serves.

One pool named after the node. On its first publish it reads the slices already there
(an earlier agent's) and continues their generation; every change of the published
devices bumps the generation and replaces every slice of the pool (the scheduler uses
only the newest generation of a pool), and slices left over from a larger pool are
deleted.

The stored slices are kept as they were written, as upstream's ResourceSlice controller
keeps them: `noticed` takes each event of a watch on the node's slices, and one that is
not the echo of our own write (a slice deleted, as a starting kubelet deletes them all,
or edited, or added) marks the view `stale`. The next publish then reads the slices
again and rewrites each one whose resourceVersion is not the one we wrote, deletes
those that should not be there, and keeps the generation. A failed write is retried by
the front-end; until then `pending` is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from gpuslice.core.dra.devices import DraOptions, Json
from gpuslice.core.dra.slices import SliceChange, build_slices
from gpuslice.core.ports import DraApi

log = structlog.get_logger("gpuslice.dra")
OURS = ("ADDED", "MODIFIED")


class SlicePublisher:
    def __init__(self, api: DraApi, *, node: str, opts: DraOptions) -> None:
        self.api = api
        self.node = node
        self.opts = opts
        self.generation = 0
        self.slices: list[Json] = []  # as last published
        self._entries: list[Json] | None = None  # the devices last published
        self._stored: dict[str, dict[str, object]] | None = None  # name -> stored object
        self._written: dict[str, str | None] = {}  # name -> resourceVersion we wrote
        self.pending = True  # what should be published is not (yet)
        self.stale = False  # the stored slices may differ from what we wrote
        self.repairs = 0  # slices rewritten or deleted because someone changed them

    def noticed(self, change: SliceChange) -> bool:
        """Take one event of the slice watch; True when it is not the echo of our own
        write (the view is then stale)."""
        if change.kind in OURS and self._written.get(change.name) == change.resource_version:
            return False
        if change.kind not in (*OURS, "DELETED"):
            return False
        if change.kind == "DELETED" and change.name not in self._written:
            return False
        self.stale = True
        return True

    async def publish(self, entries: Sequence[Json], counter_sets: Sequence[Json] = ()) -> bool:
        """Publish `entries` (the devices) and `counter_sets` unless they already are as
        written; True when it wrote. Raises BackendError, leaving `pending` set."""
        wanted = [*counter_sets, *entries]
        if wanted == self._entries and not self.pending and not self.stale:
            return False
        self.pending = True
        if self._stored is None or self.stale:
            self.stale = False
            found = await self.api.list_slices(self.node, self.opts.driver)
            self._stored = {_name(s): s for s in found}
            self.generation = max(self.generation, *(_generation(s) for s in found), 0)
        new = wanted != self._entries
        slices = (
            build_slices(
                list(entries),
                node=self.node,
                opts=self.opts,
                generation=self.generation + 1,
                counter_sets=counter_sets,
            )
            if new
            else self.slices
        )
        wrote = await self._converge(slices, rewrite=new)
        if new:
            self.generation += 1
            log.info("dra_slices_published", node=self.node, generation=self.generation,
                     slices=len(slices), devices=len(entries))  # fmt: skip
        elif wrote:
            self.repairs += wrote
            log.warning("dra_slices_repaired", node=self.node, generation=self.generation,
                        slices=wrote)  # fmt: skip
        self.slices, self._entries, self.pending = slices, wanted, False
        return bool(new or wrote)

    async def _converge(self, slices: list[Json], *, rewrite: bool) -> int:
        """Make the stored slices `slices`: each written unless it is stored as we wrote
        it (all of them when `rewrite`), the others deleted; how many were written or
        deleted."""
        assert self._stored is not None
        stored = dict(self._stored)
        count = 0
        try:
            for body in slices:
                name = _name(body)
                there = stored.get(name)
                if not rewrite and there is not None and _version(there) == self._written.get(name):
                    continue
                stored[name] = await self.api.put_slice(body, there)
                self._written[name] = _version(stored[name])
                count += 1
            for name in sorted(set(stored) - {_name(s) for s in slices}):
                await self.api.delete_slice(name)
                del stored[name]
                self._written.pop(name, None)
                count += 1
        except BaseException:
            self._stored = None  # re-read before the next try: what was written is unknown
            raise
        self._stored = stored
        return count

    async def withdraw(self) -> None:
        """Delete every slice of the pool (the plugin cannot prepare: not registered)."""
        found = await self.api.list_slices(self.node, self.opts.driver)
        for s in found:
            await self.api.delete_slice(_name(s))
        self.generation = max(self.generation, *(_generation(s) for s in found), 0)
        self._stored, self._entries, self.pending, self.stale = {}, None, True, False
        self._written.clear()
        if found:
            log.warning("dra_slices_withdrawn", node=self.node, slices=len(found))


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _version(obj: dict[str, Any]) -> str | None:
    value = obj.get("metadata", {}).get("resourceVersion")
    return str(value) if value is not None else None


def _generation(obj: dict[str, Any]) -> int:
    pool = obj.get("spec", {}).get("pool", {})
    value = pool.get("generation", 0)
    return value if isinstance(value, int) else 0
