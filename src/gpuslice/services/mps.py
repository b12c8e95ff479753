"""MPS control daemons, one supervised per MPS resource.

A resource's daemon is started and given its limits before the resource is served;
while it does not answer (not yet started, died, restarting) every GPU of the resource
is held Unhealthy (NodeDevices.hold, by "mps"), so its replicas are never
advertised without a daemon behind them. A daemon that exits is started again after
core.restart's backoff; once the budget is spent its replicas stay Unhealthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable

import structlog

from gpuslice.core.mps import DaemonPlan
from gpuslice.core.ports import MpsControl, MpsError
from gpuslice.core.restart import FailureRun, RestartBudget, after_failure

log = structlog.get_logger("gpuslice.mps")

Hold = Callable[..., object]  # NodeDevices.hold(held, by=...)
Control = Callable[[DaemonPlan], MpsControl]  # adapters.mps.ControlDaemon(plan, binary)


class _Daemon:
    """One resource's daemon and the task that keeps it running."""

    def __init__(self, daemon: MpsControl, owner: MpsDaemons) -> None:
        self.daemon = daemon
        self.up = False
        self.gave_up = False
        self._owner = owner
        self._run = FailureRun()
        self._task: asyncio.Task[None] | None = None

    @property
    def plan(self) -> DaemonPlan:
        return self.daemon.plan

    async def start(self) -> None:
        """One start now (awaited: the resource registers after it), then supervise."""
        await self._try_start()
        self._task = asyncio.create_task(self._supervise())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.daemon.quit()
        self.up = False
        log.info("mps_daemon_stopped", resource=self.plan.resource)

    async def _try_start(self) -> None:
        try:
            await self.daemon.start()
        except MpsError as exc:
            self.up = False
            log.error("mps_daemon_failed", resource=self.plan.resource, error=str(exc))
        else:
            self.up = True
            log.info(
                "mps_daemon_started",
                resource=self.plan.resource,
                pid=self.daemon.pid(),
                gpus=",".join(self.plan.gpu_uuids),
                pinned_mib=",".join(map(str, self.plan.pinned_mib)),
                thread_percentage=self.plan.thread_percentage,
            )
        self._owner.changed()

    async def _supervise(self) -> None:
        budget, timing = self._owner.budget, self._owner
        while True:
            if self.up:
                await self.daemon.exited()
                self.up = False
                log.warning("mps_daemon_exited", resource=self.plan.resource)
                self._owner.changed()
            verdict = after_failure(self._run, timing.clock(), budget)
            self._run = verdict.run
            if verdict.retry_in_s is None:
                self.gave_up = True
                log.error(
                    "mps_daemon_gave_up",
                    resource=self.plan.resource,
                    failures=verdict.run.count,
                    budget=budget.describe(),
                )
                return
            await timing.sleep(verdict.retry_in_s)
            await self._try_start()


class MpsDaemons:
    def __init__(
        self,
        control: Control,
        *,
        pinned_limit_mib: int = 0,
        budget: RestartBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._control = control
        self.pinned_limit_mib = pinned_limit_mib
        self.budget = budget or RestartBudget()
        self.clock, self.sleep = clock, sleep
        self.daemons: dict[str, _Daemon] = {}
        self._hold: Hold | None = None

    async def apply(self, plans: Iterable[DaemonPlan], hold: Hold) -> None:
        """Run exactly the daemons of `plans` (a changed plan restarts its daemon)."""
        self._hold = hold
        wanted = {p.resource: p for p in plans}
        for name in [n for n, d in self.daemons.items() if wanted.get(n) != d.plan]:
            await self.daemons.pop(name).stop()
        fresh = [
            self.daemons.setdefault(name, _Daemon(self._control(plan), self))
            for name, plan in wanted.items()
            if name not in self.daemons
        ]
        await asyncio.gather(*(d.start() for d in fresh))
        self.changed()

    async def close(self) -> None:
        """Stop every daemon (quit)."""
        daemons, self.daemons = list(self.daemons.values()), {}
        with contextlib.suppress(Exception):
            await asyncio.gather(*(d.stop() for d in daemons))
        self.changed()

    def changed(self) -> None:
        """Hold every GPU of a resource whose daemon is not answering."""
        down = frozenset(u for d in self.daemons.values() if not d.up for u in d.plan.gpu_uuids)
        if self._hold is not None:
            self._hold(down, by="mps")
