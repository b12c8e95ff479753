"""MPS control daemons, one supervised per MPS resource directory, that outlive the agent.

Each resource directory (<mpsRoot>/<resource>) has one supervisor, a task that brings
what runs there to what the config wants, one step at a time:

    nothing runs, a plan wanted     -> STARTING: start the daemon (core.restart's backoff
                                       and budget on failure: BACKING_OFF, FAILED)
    a daemon runs that keeps the plan -> SERVING: its limits set for new clients
                                       (set_default_* and set_* per server, no restart);
                                       a daemon found at start is adopted so
    a daemon runs that cannot         -> WAITING: its clients are left to finish; once it
      (other GPUs, or no plan)           has none it is quit and, when a plan is wanted,
                                       the new daemon started. It is never killed.

The supervisors only ever wait on the daemon, so applying a config returns at once.
While a resource's daemon is not SERVING its plan, every GPU of the resource is held
Unhealthy (PluginManager.hold_unhealthy, by "mps"): the replicas are withheld, and a
wait for clients shows in `waiting` (readiness) and in one Event per wait. Stopping the
agent leaves every daemon running; the next agent adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import posixpath
import time
from collections.abc import Awaitable, Callable, Iterable

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.mps import DaemonPlan, RunningDaemon, keeps, plan_daemons
from gpuslice.core.ports import MpsCommands, MpsError, MpsLauncher
from gpuslice.core.resources import Resource
from gpuslice.core.restart import FailureRun, RestartBudget, after_failure
from gpuslice.core.waiting import unless_stopped

log = structlog.get_logger("gpuslice.mps")

MPS_WAITING_REASON = "MpsDaemonWaiting"  # the Node Event of a replacement that waits

Hold = Callable[..., object]  # PluginManager.hold_unhealthy(held, by=...)
Notify = Callable[[str], Awaitable[None]]  # records a Node Event
POLL_S = 5.0  # how often a retiring daemon's clients are counted


class Phase(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    WAITING = "waiting"  # for the clients of a daemon that must go
    BACKING_OFF = "backing_off"
    FAILED = "failed"  # the restart budget is spent
    STOPPED = "stopped"  # nothing runs, nothing wanted


class _Daemon:
    """The supervisor of one resource directory."""

    def __init__(self, root: str, resource: str, owner: MpsDaemons) -> None:
        self.root, self.resource = root, resource
        self.want: DaemonPlan | None = None
        self.served: DaemonPlan | None = None  # the plan the running daemon has, while SERVING
        self.phase = Phase.STARTING
        self.waiting: str | None = None  # why new replicas are withheld, while WAITING
        self._owner = owner
        self._wake = asyncio.Event()
        self._failures = FailureRun()
        self._started: int | None = None  # the pid of the daemon this agent started last
        self._task: asyncio.Task[None] | None = None

    @property
    def up(self) -> bool:
        return self.phase is Phase.SERVING and self.want is not None and self.served == self.want

    def wanted(self, plan: DaemonPlan | None) -> None:
        changed, self.want = plan != self.want, plan
        self._wake.set()
        if self._task is None or (self._task.done() and (changed or self.phase is Phase.STOPPED)):
            self._failures = FailureRun()  # a new plan after giving up is tried afresh
            self._task = asyncio.create_task(self._run())

    async def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            want = self.want
            try:
                running = await self._owner.launcher.running(self.root)
                if running is None and want is None:
                    self._set(Phase.STOPPED)
                    return
                if running is None:
                    assert want is not None
                    await self._start(want)
                elif want is None or not keeps(running, want):
                    await self._retire(running, want)
                else:
                    await self._serve(running, want)
            except MpsError as exc:
                if not await self._failed(str(exc)):
                    return

    def _set(self, phase: Phase, waiting: str | None = None) -> None:
        self.phase, self.waiting = phase, waiting
        if phase is not Phase.SERVING:
            self.served = None
        self._owner.changed()

    async def _start(self, plan: DaemonPlan) -> None:
        self._set(Phase.STARTING)
        daemon = await self._owner.launcher.start(plan)
        self._started = daemon.pid
        log.info("mps_daemon_started", resource=self.resource, pid=daemon.pid, gpus=_gpus(plan))

    async def _serve(self, running: RunningDaemon, plan: DaemonPlan) -> None:
        if self.served != plan:
            adopted = running.pid != self._started
            await self._owner.commands.limit(plan)
            self.served = plan
            log.info(
                "mps_daemon_limits_set",
                resource=self.resource,
                pid=running.pid,
                pinned_mib=",".join(map(str, plan.pinned_mib)),
                thread_percentage=plan.thread_percentage,
                adopted=adopted,
            )
        self._set(Phase.SERVING)
        if await self._until(self._owner.launcher.exited(running)):
            again = await self._owner.launcher.running(self.root)
            if again is None or again.pid != running.pid:
                raise MpsError(f"the MPS daemon of {self.resource} (pid {running.pid}) exited")

    async def _retire(self, running: RunningDaemon, want: DaemonPlan | None) -> None:
        """Quit a daemon that cannot stay, once it has no clients; never kill it."""
        old = _plan_of(running, self.resource)
        try:
            clients = await self._owner.commands.clients(old)
        except MpsError as exc:  # it answers nothing, so it serves nobody: asked again
            log.warning("mps_daemon_unanswered", resource=self.resource, error=str(exc))
            clients = -1
        if clients:
            why = _why_waiting(self.resource, running, want, clients)
            if self.waiting != why:
                log.warning("mps_daemon_waiting", resource=self.resource, detail=why)
                if want is not None and self.phase is not Phase.WAITING:
                    self._owner.notify_later(why)
            self._set(Phase.WAITING, why)
            await self._until(self._owner.sleep(self._owner.poll_s))
            return
        self._set(Phase.WAITING, None)
        with contextlib.suppress(MpsError):  # a client came meanwhile: quit still ends it
            await self._owner.commands.quit(old)
        await self._until(self._owner.launcher.exited(running))
        log.info("mps_daemon_quit", resource=self.resource, pid=running.pid)

    async def _until(self, work: Awaitable[None]) -> bool:
        """Wait for `work` or a new plan; True when `work` ended first."""
        task = await unless_stopped(_awaited(work), self._wake)
        return task is not None and task.exception() is None

    async def _failed(self, error: str) -> bool:
        """Count a failure; back off and return True, or give up and return False."""
        owner = self._owner
        verdict = after_failure(self._failures, owner.clock(), owner.budget)
        self._failures = verdict.run
        if verdict.retry_in_s is None:
            log.error(
                "mps_daemon_gave_up",
                resource=self.resource,
                failures=verdict.run.count,
                budget=owner.budget.describe(),
                error=error,
            )
            self._set(Phase.FAILED)
            return False
        log.error(
            "mps_daemon_failed", resource=self.resource, error=error, retry_in_s=verdict.retry_in_s
        )
        self._set(Phase.BACKING_OFF)
        await self._until(owner.sleep(verdict.retry_in_s))
        return True


class MpsDaemons:
    def __init__(
        self,
        launcher: MpsLauncher,
        commands: MpsCommands,
        *,
        pinned_limit_mib: int = 0,
        roots: Iterable[str] = (),
        budget: RestartBudget | None = None,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`roots`: MPS roots looked through for daemons to adopt or retire beside the
        config's mpsRoot (the --mps-root the node was deployed with)."""
        self.launcher, self.commands = launcher, commands
        self.pinned_limit_mib = pinned_limit_mib
        self.budget = budget or RestartBudget()
        self.poll_s = poll_s
        self.clock, self.sleep = clock, sleep
        self.notify: Notify | None = None  # records why new replicas are withheld
        self.daemons: dict[str, _Daemon] = {}
        self._roots = {r for r in roots if r}
        self._scanned: set[str] = set()
        self._hold: Hold | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()  # set, and replaced, on each change of a daemon

    def plan(
        self, snapshot: HardwareSnapshot, resources: Iterable[Resource], mps_root: str
    ) -> tuple[DaemonPlan, ...]:
        """The daemons `resources` need; raises HardwareError (nothing started)."""
        return plan_daemons(
            resources, snapshot.gpus, mps_root, pinned_limit_mib=self.pinned_limit_mib
        )

    def apply(self, plans: Iterable[DaemonPlan], hold: Hold, mps_root: str = "") -> None:
        """Want exactly the daemons of `plans`; returns at once (the supervisors do the
        work, holding each resource's GPUs until its daemon serves its plan)."""
        self._hold = hold
        wanted = {p.root: p for p in plans}
        for root, daemon in self.daemons.items():
            if root not in wanted:
                daemon.wanted(None)
        for root, plan in wanted.items():
            self._daemon(root, plan.resource).wanted(plan)
        for root in ({mps_root} | self._roots) - self._scanned - {""}:
            self._scanned.add(root)
            self._spawn(self._adopt_unwanted(root))
        self.changed()

    @property
    def waiting(self) -> dict[str, str]:
        """resource -> why its new replicas are withheld (a daemon's clients to leave)."""
        return {
            d.resource: d.waiting for d in self.daemons.values() if d.waiting and d.want is not None
        }

    def status(self) -> dict[str, str]:
        return {d.resource: d.phase.value for d in self.daemons.values()}

    async def close(self) -> None:
        """Stop supervising; every daemon keeps running for the next agent."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        daemons, self.daemons = list(self.daemons.values()), {}
        await asyncio.gather(*(d.cancel() for d in daemons))
        running = [d.resource for d in daemons if d.phase is not Phase.STOPPED]
        if running:
            log.info("mps_daemons_left_running", resources=",".join(running))
        self.changed()

    async def settled(self, condition: Callable[[], bool]) -> None:
        """Return once `condition()` holds, looked at after each change of a daemon."""
        while not condition():
            await self._changed.wait()

    def changed(self) -> None:
        """Hold every GPU of a resource whose daemon does not serve its plan."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        down = frozenset(
            u
            for d in self.daemons.values()
            if d.want is not None and not d.up
            for u in d.want.gpu_uuids
        )
        if self._hold is not None:
            self._hold(down, by="mps")

    def notify_later(self, message: str) -> None:
        if self.notify is not None:
            self._spawn(self.notify(message))

    def _daemon(self, root: str, resource: str) -> _Daemon:
        if root not in self.daemons:
            self.daemons[root] = _Daemon(root, resource, self)
        return self.daemons[root]

    async def _adopt_unwanted(self, mps_root: str) -> None:
        """Daemons found under `mps_root` that no plan wants: retired once idle."""
        try:
            found = await self.launcher.found(mps_root)
        except MpsError as exc:
            log.warning("mps_daemons_not_listed", mps_root=mps_root, error=str(exc))
            self._scanned.discard(mps_root)
            return
        for daemon in found:
            if daemon.root not in self.daemons:
                resource = posixpath.relpath(daemon.root, mps_root)
                log.info("mps_daemon_unwanted", resource=resource, pid=daemon.pid)
                self._daemon(daemon.root, resource).wanted(None)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _awaited(work: Awaitable[None]) -> None:
    await work


def _plan_of(running: RunningDaemon, resource: str) -> DaemonPlan:
    """Enough of a plan to send commands to `running`."""
    return DaemonPlan(resource, running.root, running.gpu_uuids or (), (), 100)


def _why_waiting(
    resource: str, running: RunningDaemon, want: DaemonPlan | None, clients: int
) -> str:
    who = f"{clients} client{'s' if clients != 1 else ''}" if clients > 0 else "its clients"
    if want is None:
        return f"{resource}: the MPS daemon (pid {running.pid}) is quit once its {who} leave"
    change = "its GPUs changed" if running.gpu_uuids is not None else "it was not started so"
    return (
        f"{resource}: new replicas withheld until the {who} of its MPS daemon "
        f"(pid {running.pid}) leave: {change}, so it is replaced then"
    )


def _gpus(plan: DaemonPlan) -> str:
    return ",".join(plan.gpu_uuids)
