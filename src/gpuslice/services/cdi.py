"""Keeps the CDI specs in step with what the agent serves.

The agent calls `apply` with every set of resources it is about to serve (start-up,
reload, per-node config switch). The specs outlive the agent: a container of a running
pod that restarts while no agent runs (a rolling update) still resolves its devices,
and the next agent finds them in place. Health changes do not
reach here: an unhealthy device keeps its CDI name (core.cdi says why). A spec that
cannot be written is logged and kept in `error`; the next apply tries again, and the
resources are served either way. Under a cdi-* strategy each apply also looks up the
NVIDIA Container Toolkit's spec (`find_toolkit`, off the loop), whose device names
Allocate returns beside ours; when there is none, one line says so and `toolkit_problem`
keeps it for readiness.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from gpuslice.core.cdi import build_specs, uses_cdi
from gpuslice.core.cdi_toolkit import ToolkitDevices
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
        find_toolkit: Callable[[], ToolkitDevices] | None = None,
    ) -> None:
        self._store = store
        self._control = tuple(control_devices)
        self._extra = dict(extra_nodes or {})
        self._find_toolkit = find_toolkit
        self.error: str | None = None  # why the last write failed, until one succeeds
        self.toolkit_problem: str | None = None  # why the toolkit's devices are not named

    async def apply(self, resources: Iterable[Resource], opts: AllocateOptions) -> AllocateOptions:
        """Write the specs `opts` asks for (none without a CDI strategy); `opts` with the
        toolkit's devices found, to serve with."""
        opts = await self._with_toolkit(opts)
        specs = build_specs(resources, opts, control_devices=self._control, extra_nodes=self._extra)
        try:
            changed = await self._store.sync(specs)
        except BackendError as exc:
            self.error = str(exc)
            log.error("cdi_spec_write_failed", error=self.error)
            return opts
        self.error = None
        if changed:
            log.info("cdi_specs_updated", files=",".join(changed), kept=len(specs))
        return opts

    async def _with_toolkit(self, opts: AllocateOptions) -> AllocateOptions:
        if not uses_cdi(opts) or self._find_toolkit is None:
            self.toolkit_problem = None
            return opts
        found = await asyncio.to_thread(self._find_toolkit)
        if found.problem != self.toolkit_problem:
            if found.problem is not None:
                log.warning("cdi_toolkit_spec_missing", detail=found.problem)
            else:
                log.info("cdi_toolkit_spec_found", path=found.source, devices=len(found.names))
        self.toolkit_problem = found.problem
        return dataclasses.replace(opts, toolkit_cdi=found)
