"""MPS control daemons, one supervised per MPS resource directory, that outlive the agent.

Each resource directory (<mpsRoot>/<resource>) has one supervisor, a state machine in
services.machine's idiom (the plugin servers' too). Each step looks at what runs there
and takes one action towards what the config wants; its outcome decides the next:

    nothing runs, a plan wanted      STARTING: start the daemon; look again
    a daemon runs that keeps the plan  set its limits for new clients if they differ
                                     (set_default_* and set_* per server, no restart):
                                     SERVING, watching it exit (a daemon found at start
                                     is adopted so)
    a daemon runs that cannot stay    it has clients: WAITING, counted again after
      (other GPUs, or no plan)       POLL_S; none: quit (never killed), look again
    nothing runs, nothing wanted     STOPPED
    an error, or the daemon exited   BACKING_OFF by core.restart's backoff, FAILED once
                                     its budget is spent (a new plan is tried afresh)

Applying a config only sets each supervisor's plan and returns. While a resource's
daemon is not SERVING its plan, every GPU of the resource is held Unhealthy (by "mps"):
the replicas are withheld, and a wait for clients shows in `waiting` (readiness) and in
one Event per wait. Stopping the agent leaves every daemon running (CLOSED); the next
agent adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import posixpath
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.mps import DaemonPlan, RunningDaemon, keeps, plan_daemons
from gpuslice.core.ports import MpsCommands, MpsError, MpsLauncher
from gpuslice.core.resources import Resource
from gpuslice.core.restart import FailureRun, RestartBudget, after_failure
from gpuslice.services.machine import Machine, TimerDue

log = structlog.get_logger("gpuslice.mps")

MPS_WAITING_REASON = "MpsDaemonWaiting"  # the Node Event of a replacement that waits

Hold = Callable[..., object]  # PluginManager.hold_unhealthy(held, by=...)
Notify = Callable[[str], Awaitable[None]]  # records a Node Event
POLL_S = 5.0  # how often a retiring daemon's clients are counted


class Phase(enum.Enum):
    STARTING = "starting"  # looking, starting a daemon or setting its limits
    SERVING = "serving"
    WAITING = "waiting"  # for the clients of a daemon that must go
    BACKING_OFF = "backing_off"
    FAILED = "failed"  # the restart budget is spent
    STOPPED = "stopped"  # nothing runs, nothing wanted
    CLOSED = "closed"  # no longer supervised (the agent stops): the daemon runs on


@dataclass(frozen=True)
class Wake:
    changed: bool  # the plan is another one


@dataclass(frozen=True)
class Close: ...


@dataclass(frozen=True)
class Again:  # look again at once (a daemon was started or quit)
    started: int | None = None  # the pid of the daemon this step started


@dataclass(frozen=True)
class Serving:
    running: RunningDaemon
    plan: DaemonPlan


@dataclass(frozen=True)
class Waiting:
    why: str


@dataclass(frozen=True)
class Stopped: ...


@dataclass(frozen=True)
class Failed:
    error: str


Outcome = Again | Serving | Waiting | Stopped | Failed


@dataclass(frozen=True)
class Done:
    step: int
    outcome: Outcome


class _Daemon(Machine[Phase]):
    """The supervisor of one resource directory (services.machine's idiom): each look at
    the directory is one step, whose outcome decides the next."""

    def __init__(self, root: str, resource: str, owner: MpsDaemons) -> None:
        self.root, self.resource = root, resource
        self.want: DaemonPlan | None = None  # desired: set by apply, read by each look
        self.served: DaemonPlan | None = None  # the plan the running daemon has, while SERVING
        self.waiting: str | None = None  # why it waits for clients, while WAITING
        self._owner = owner
        self._failures = FailureRun()
        self._started: int | None = None  # the pid of the daemon this agent started last
        super().__init__(resource, Phase.STARTING, Phase.CLOSED)

    @property
    def up(self) -> bool:
        return self.state is Phase.SERVING and self.want is not None and self.served == self.want

    def wanted(self, plan: DaemonPlan | None) -> None:
        changed, self.want = plan != self.want, plan
        self.post(Wake(changed))

    def set(self, state: Phase, waiting: str | None = None) -> None:
        self.waiting = waiting
        if state is not Phase.SERVING:
            self.served = None
        super().set(state)
        self._owner.changed()

    async def handle(self, event: object) -> None:
        if isinstance(event, Close):
            await self.cancel_step()
            self.set(Phase.CLOSED)
        elif isinstance(event, Wake):
            if self.state is Phase.FAILED:
                if not event.changed:
                    return
                self._failures = FailureRun()  # a new plan after giving up is tried afresh
            await self._look()
        elif isinstance(event, TimerDue) and self.current(event.step):
            await self._look()
        elif isinstance(event, Done) and self.current(event.step):
            await self._outcome(event.outcome)

    async def _look(self) -> None:
        if self.state not in (Phase.SERVING, Phase.WAITING):
            self.set(Phase.STARTING)
        want, served, started = self.want, self.served, self._started
        await self.spawn(lambda step: self._work(step, want, served, started))

    async def _outcome(self, outcome: Outcome) -> None:
        owner = self._owner
        if isinstance(outcome, Again):
            self._started = outcome.started or self._started
            await self._look()
        elif isinstance(outcome, Serving):
            self.set(Phase.SERVING)
            self.served = outcome.plan
            owner.changed()
            await self.spawn(lambda step: self._watch(step, outcome.running, outcome.plan))
        elif isinstance(outcome, Waiting):
            if self.waiting != outcome.why:
                log.warning("mps_daemon_waiting", resource=self.resource, detail=outcome.why)
                if self.want is not None and self.state is not Phase.WAITING:
                    owner.notify_later(outcome.why)
            self.set(Phase.WAITING, outcome.why)
            await self.timer(owner.poll_s, owner.sleep)
        elif isinstance(outcome, Stopped):
            self.set(Phase.STOPPED)
        else:
            await self._failed(outcome.error)

    async def _failed(self, error: str) -> None:
        """Count a failure: look again after the backoff, or give up."""
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
            self.set(Phase.FAILED)
            return
        log.error(
            "mps_daemon_failed", resource=self.resource, error=error, retry_in_s=verdict.retry_in_s
        )
        self.set(Phase.BACKING_OFF)
        await self.timer(verdict.retry_in_s, owner.sleep)

    # --- steps: they only look, act and post their outcome ---------------------------------

    async def _work(
        self, step: int, want: DaemonPlan | None, served: DaemonPlan | None, started: int | None
    ) -> None:
        try:
            outcome = await self._act(want, served, started)
        except MpsError as exc:
            outcome = Failed(str(exc))
        self.post(Done(step, outcome))

    async def _act(
        self, want: DaemonPlan | None, served: DaemonPlan | None, started: int | None
    ) -> Outcome:
        """One step towards `want`: start, set limits, wait for clients or quit."""
        launcher, commands = self._owner.launcher, self._owner.commands
        running = await launcher.running(self.root)
        if running is None and want is None:
            return Stopped()
        if running is None:
            assert want is not None
            daemon = await launcher.start(want)
            self._started = daemon.pid
            log.info("mps_daemon_started", resource=self.resource, pid=daemon.pid, gpus=_gpus(want))
            return Again()
        if want is None or not keeps(running, want):
            return await self._retire(running, want)
        if served != want:
            await commands.limit(want)
            log.info(
                "mps_daemon_limits_set",
                resource=self.resource,
                pid=running.pid,
                pinned_mib=",".join(map(str, want.pinned_mib)),
                thread_percentage=want.thread_percentage,
                adopted=running.pid != started,
            )
        return Serving(running, want)

    async def _retire(self, running: RunningDaemon, want: DaemonPlan | None) -> Outcome:
        """Quit a daemon that cannot stay, once it has no clients; never kill it."""
        old = _plan_of(running, self.resource)
        try:
            clients = await self._owner.commands.clients(old)
        except MpsError as exc:  # it answers nothing, so it serves nobody: asked again
            log.warning("mps_daemon_unanswered", resource=self.resource, error=str(exc))
            clients = -1
        if clients:
            return Waiting(_why_waiting(self.resource, running, want, clients))
        with contextlib.suppress(MpsError):  # a client came meanwhile: quit still ends it
            await self._owner.commands.quit(old)
        await self._owner.launcher.exited(running)
        log.info("mps_daemon_quit", resource=self.resource, pid=running.pid)
        return Again()

    async def _watch(self, step: int, running: RunningDaemon, plan: DaemonPlan) -> None:
        """While serving: post once the daemon exits (or can no longer be watched)."""
        outcome: Outcome
        try:
            await self._owner.launcher.exited(running)
            again = await self._owner.launcher.running(self.root)
        except MpsError as exc:
            outcome = Failed(str(exc))
        else:
            outcome = (
                Serving(again, plan)
                if again is not None and again.pid == running.pid
                else Failed(f"the MPS daemon of {self.resource} (pid {running.pid}) exited")
            )
        self.post(Done(step, outcome))


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
        return {d.resource: d.state.value for d in self.daemons.values()}

    async def close(self) -> None:
        """Stop supervising; every daemon keeps running for the next agent."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        daemons, self.daemons = list(self.daemons.values()), {}
        left = [d.resource for d in daemons if d.state is not Phase.STOPPED]
        for daemon in daemons:
            daemon.post(Close())
        await asyncio.gather(*(d.join() for d in daemons))
        running = left
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
