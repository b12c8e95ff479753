"""Keeps the CDI specs in step with what the agent serves.

The agent calls `apply` with every set of resources it is about to serve (start-up,
reload, per-node config switch). The specs outlive the agent: a container of a running
pod that restarts while no agent runs (a rolling update) still resolves its devices,
and the next agent finds them in place. Health changes do not
reach here: an unhealthy device keeps its CDI name (core.cdi says why). A spec that
cannot be written is logged and kept in `error`; the next apply tries again, and the
resources are served either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import structlog

from gpuslice.core.cdi import build_specs
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import CdiStore
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions

log = structlog.get_logger("gpuslice.cdi")


class CdiSpecs:
    def __init__(
        self,
        store: CdiStore,
        *,
        control_devices: Sequence[str] = (),
        extra_nodes: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._store = store
        self._control = tuple(control_devices)
        self._extra = dict(extra_nodes or {})
        self.error: str | None = None  # why the last write failed, until one succeeds

    async def apply(self, resources: Iterable[Resource], opts: AllocateOptions) -> None:
        """Write the specs `opts` asks for (none without a CDI strategy)."""
        specs = build_specs(resources, opts, control_devices=self._control, extra_nodes=self._extra)
        try:
            changed = await self._store.sync(specs)
        except BackendError as exc:
            self.error = str(exc)
            log.error("cdi_spec_write_failed", error=self.error)
            return
        self.error = None
        if changed:
            log.info("cdi_specs_updated", files=",".join(changed), kept=len(specs))
