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

The toolkit's spec may appear, change or go while the agent runs (the toolkit's
DaemonSet finishing after the agent, `nvidia-ctk cdi generate` after a driver upgrade):
`follow_toolkit` watches its directories (/var/run/cdi and /etc/cdi), and each change
of a spec file is looked up again within DEBOUNCE_S (a burst of writes is one lookup);
a different result is told to every `on_toolkit` listener (each front-end names the
toolkit's devices from it), so new allocations name a spec that appeared and stop
naming one that went.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from gpuslice.core.cdi import build_specs, uses_cdi
from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import CdiStore, DirWatch
from gpuslice.core.resources import Resource
from gpuslice.core.response import AllocateOptions

log = structlog.get_logger("gpuslice.cdi")

DEBOUNCE_S = 0.1  # after a change, the writes that follow it at once are one lookup
ToolkitListener = Callable[[ToolkitDevices], None]


class CdiSpecs:
    def __init__(
        self,
        store: CdiStore,
        *,
        control_devices: Sequence[str] = (),
        extra_nodes: Mapping[str, Sequence[str]] | None = None,
        find_toolkit: Callable[[], ToolkitDevices] | None = None,
        # The directories find_toolkit reads, and how to watch one (None: not followed).
        toolkit_dirs: Sequence[str] = (),
        watch: DirWatch | None = None,
        is_spec: Callable[[str], bool] = lambda _: True,  # a file name the lookup reads
    ) -> None:
        self._store = store
        self._control = tuple(control_devices)
        self._extra = dict(extra_nodes or {})
        self._find_toolkit = find_toolkit
        self._toolkit_dirs = tuple(toolkit_dirs)
        self._watch = watch
        self._is_spec = is_spec
        self._listeners: list[ToolkitListener] = []
        self._in_use = False  # the settings served use a cdi-* strategy
        self._always = False  # a listener needs the toolkit's devices whatever the settings
        self.toolkit = ToolkitDevices()  # as last looked up
        self._said_source = ""  # the spec file the last found line named
        self.error: str | None = None  # why the last write failed, until one succeeds
        self.toolkit_problem: str | None = None  # why the toolkit's devices are not named

    def on_toolkit(self, listener: ToolkitListener, *, always: bool = False) -> None:
        """Call `listener(found)` whenever a watched change finds other toolkit devices:
        while the settings served use a cdi-* strategy, or `always` (DRA names them in
        every claim). With neither, a change is not looked up."""
        self._listeners.append(listener)
        self._always = self._always or always

    async def follow_toolkit(self) -> None:
        """Look the toolkit's spec up again on every change of a spec file in its
        directories; runs until cancelled (returns at once when nothing is watched)."""
        if self._find_toolkit is None or self._watch is None or not self._toolkit_dirs:
            return
        changed = asyncio.Event()
        try:
            async with asyncio.TaskGroup() as group:
                for directory in self._toolkit_dirs:
                    group.create_task(self._watch_dir(directory, changed))
                while True:
                    await changed.wait()
                    await asyncio.sleep(DEBOUNCE_S)
                    changed.clear()
                    await self._look_up_again()
        except Exception as exc:  # the specs are then read at applies only
            log.error("cdi_toolkit_watch_failed", error=str(exc) or repr(exc))

    async def _watch_dir(self, directory: str, changed: asyncio.Event) -> None:
        assert self._watch is not None
        async with self._watch(directory, None) as events:
            async for name, _kind in events:
                if self._is_spec(name):
                    changed.set()

    async def _look_up_again(self) -> None:
        assert self._find_toolkit is not None
        if not (self._in_use or self._always):
            return  # read at the next apply that needs it
        found = await asyncio.to_thread(self._find_toolkit)
        if found == self.toolkit:
            return
        self.toolkit = found
        if self._in_use:
            self._say(found)
        for listener in self._listeners:
            listener(found)

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
        self._in_use = uses_cdi(opts)
        if not self._in_use or self._find_toolkit is None:
            self.toolkit_problem = None
            return opts
        found = await asyncio.to_thread(self._find_toolkit)
        self.toolkit = found
        self._say(found)
        return dataclasses.replace(opts, toolkit_cdi=found)

    def _say(self, found: ToolkitDevices) -> None:
        """Log a change of the toolkit's spec (found, gone, or another file)."""
        if found.problem != self.toolkit_problem or found.problem is None:
            if found.problem is not None:
                log.warning("cdi_toolkit_spec_missing", detail=found.problem)
            elif found.source != self._said_source:
                log.info("cdi_toolkit_spec_found", path=found.source, devices=len(found.names))
        self._said_source = found.source
        self.toolkit_problem = found.problem
