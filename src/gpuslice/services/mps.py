"""MPS control daemons, one supervised per MPS resource directory, that outlive the agent.

Each resource directory (<mpsRoot>/<resource>) has one supervisor: services.supervision's
state machine (the plugin servers' too), whose target's start() brings the directory to
what the config wants:

    a daemon runs that keeps the plan    adopted: its limits set for new clients if they
                                         differ (set_default_* and set_* per server)
    a daemon runs that cannot stay       it has clients: start() raises MustWait and the
      (other GPUs, or no plan)           supervisor is WAITING, looking again every POLL_S;
                                         none: it is quit (never killed)
    nothing runs (any more)              a daemon is started for the plan, limits set

then RUNNING, watching the daemon: one that exits is a failure (BACKING_OFF by
core.restart's backoff, FAILED once its budget is spent; a new plan is tried afresh). A
new plan restarts the supervisor: its take-down only stops the watch, never the daemon.
With no plan left, a supervisor whose start() found nothing to run is STOPPED.

Applying a config only sets each supervisor's plan and posts an event. While a
resource's daemon is not RUNNING its plan, every GPU of the resource is held Unhealthy
(by "mps"): the replicas are withheld, and a wait for clients shows in `waiting`
(readiness) and in one Event per wait. Stopping the agent stops the supervisors only:
every daemon runs on, and the next agent adopts it.

The DRA claims' own daemons (MPS on MIG devices, frontends.dra.claim_mps) are another
MpsDaemons, `claims=True`: each owns only its side of the MPS root (core.mps.of_claim), and
holds its devices by a name of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import structlog

from gpuslice.core.mps import DaemonPlan, RunningDaemon, keeps, of_claim
from gpuslice.core.ports import MpsCommands, MpsError, MpsHostAbsent, MpsLauncher
from gpuslice.core.restart import FailureRun, RestartBudget
from gpuslice.services.supervision import Start, State, Supervisor, TimerDue, Timing

log = structlog.get_logger("gpuslice.mps")

MPS_WAITING_REASON = "MpsDaemonWaiting"  # the Node Event of a replacement that waits

Hold = Callable[..., object]  # NodeDevices.hold(held, by=...)
Notify = Callable[[str], Awaitable[None]]  # records a Node Event
POLL_S = 5.0  # how often a retiring daemon's clients are counted


QUIT_WAIT_S = 10.0  # how long a quit daemon without clients is given to exit


# A daemon's own state: an old daemon's clients to leave before it starts.
WAITING = State("waiting")


class MustWait(Exception):  # noqa: N818 - reads as what it means
    """The daemon there has clients and cannot stay: its new one waits for them."""


class Replan:
    """The plan is another one."""


class _Daemon:
    """What the supervisor of one resource directory keeps running (a Supervised):
    start() brings the directory to `want` one way or another, or raises."""

    def __init__(self, root: str, resource: str, owner: MpsDaemons) -> None:
        self.root, self.resource = root, resource
        self.want: DaemonPlan | None = None  # desired: set by apply, read at each start
        self.served: DaemonPlan | None = None  # the plan the running daemon has
        self.running: RunningDaemon | None = None
        self._started: int | None = None  # the pid of the daemon this agent started last
        self._down: str | None = None
        self._owner = owner

    async def start(self) -> None:
        """Adopt the daemon there when it keeps `want`, else quit it once it has no
        clients (MustWait while it has) and start one; then set `want`'s limits."""
        launcher, want = self._owner.launcher, self.want
        self._down = None
        running = await launcher.running(self.root)
        if running is not None and (want is None or not keeps(running, want)):
            await self._retire(running, want)
            running = None
        if want is None:
            self.running = self.served = None
            return
        if running is None:
            running = await launcher.start(want)
            self._started = running.pid
            log.info(
                "mps_daemon_started", resource=self.resource, pid=running.pid, gpus=_gpus(want)
            )
        if self.running != running or self.served != want:
            await self._owner.commands.limit(want)
            log.info(
                "mps_daemon_limits_set",
                resource=self.resource,
                pid=running.pid,
                pinned_mib=",".join(map(str, want.pinned_mib)),
                thread_percentage=want.thread_percentage,
                adopted=running.pid != self._started,
            )
        self.running, self.served = running, want

    async def _retire(self, running: RunningDaemon, want: DaemonPlan | None) -> None:
        """Quit a daemon that cannot stay once it has no clients; never kill it."""
        old = _plan_of(running, self.resource)
        try:
            clients = await self._owner.commands.clients(old)
        except MpsError as exc:  # it answers nothing, so it serves nobody: asked again
            log.warning("mps_daemon_unanswered", resource=self.resource, error=str(exc))
            clients = -1
        if clients:
            raise MustWait(_why_waiting(self.resource, running, want, clients))
        with contextlib.suppress(MpsError):  # a client came meanwhile: quit still ends it
            await self._owner.commands.quit(old)
        try:
            await asyncio.wait_for(self._owner.launcher.exited(running), QUIT_WAIT_S)
        except TimeoutError:
            raise MustWait(_why_waiting(self.resource, running, want, -1)) from None
        log.info("mps_daemon_quit", resource=self.resource, pid=running.pid)

    def down(self) -> str | None:
        return self._down

    async def wait_down(self) -> str:
        """Return once the daemon started or adopted exits (never, when none runs)."""
        running = self.running
        if running is None:
            await asyncio.Event().wait()
        assert running is not None
        while True:
            try:
                await self._owner.launcher.exited(running)
                again = await self._owner.launcher.running(self.root)
            except MpsError as exc:
                again, self._down = None, str(exc)
            if again is None or again.pid != running.pid:
                self.served = self.running = None
                self._down = self._down or f"the MPS daemon (pid {running.pid}) exited"
                return self._down
            # the same daemon: only its watch ended (mps-control restarted); watched again

    async def stop(self) -> None:
        """Stop supervising: the daemon runs on (the next agent adopts it)."""


class _Supervisor(Supervisor):
    """services.supervision's state machine for one resource directory, plus WAITING:
    a start that must wait for an old daemon's clients looks again every POLL_S."""

    _log = log
    _key = "resource"
    target: _Daemon

    def __init__(self, daemon: _Daemon, owner: MpsDaemons) -> None:
        self.waiting: str | None = None  # why it waits (clients, or mps-control), while it does
        self.error = ""  # why it failed last
        self._notified = False  # the Event of this wait for clients was recorded
        self._owner = owner
        super().__init__(
            daemon.resource,
            daemon,
            budget=owner.budget,
            timing=Timing(owner.clock, owner.sleep),
            on_state=lambda _: owner.changed(),
        )

    @property
    def up(self) -> bool:
        daemon = self.target
        return (
            self.state is State.RUNNING and daemon.want is not None and daemon.served == daemon.want
        )

    def begin(self) -> None:
        self._post(Start())

    def replan(self) -> None:
        self._post(Replan())

    async def _handle(self, event: object) -> None:
        if not isinstance(event, Replan):
            await super()._handle(event)
        elif self.state is State.FAILED:
            self._failures = FailureRun()  # a new plan after giving up is tried afresh
            await self._bring_up()
        elif self.state not in (State.NEW, State.STOPPED, State.FAILED):
            await self._restart()  # take_down only stops the watch: start() looks again

    async def _handle_more(self, event: object) -> None:
        if isinstance(event, TimerDue) and self.state is WAITING:
            await self._bring_up()

    async def _start_failed(self, exc: Exception) -> bool:
        """An old daemon's clients, or an mps-control not answering yet (it may start
        after the agent): waited for, looked at again every POLL_S, never a failure."""
        if not isinstance(exc, MustWait | MpsHostAbsent):
            return False
        why = str(exc)
        if self.waiting != why:
            log.warning("mps_daemon_waiting", resource=self.name, detail=why)
        if isinstance(exc, MustWait) and self.target.want is not None and not self._notified:
            self._owner.notify_later(why)  # one Event per wait for clients
            self._notified = True
        self.waiting = why
        self._set(WAITING)
        await self._timer(self._owner.poll_s)
        return True

    async def _after_start(self) -> None:
        if self.target.want is None:  # retired: nothing runs, nothing to supervise
            await self._take_down()
            self._set(State.STOPPED)
        else:
            self._set(State.RUNNING)

    def _set(self, state: State) -> None:
        if state not in (WAITING, State.STARTING):
            self.waiting, self._notified = None, False
        super()._set(state)

    def _failed(self, reason: str, failures: int, retry_in_s: float | None) -> None:
        self.error = reason
        if retry_in_s is None:
            log.error("mps_daemon_gave_up", resource=self.name, failures=failures,
                      budget=self._budget.describe(), error=reason)  # fmt: skip
        else:
            log.error("mps_daemon_failed", resource=self.name, failures=failures,
                      error=reason, retry_in_s=retry_in_s)  # fmt: skip


@dataclass(frozen=True)
class MpsTools:
    """What the daemons are run and asked through, and where their waits are recorded."""

    launcher: MpsLauncher
    commands: MpsCommands
    notify: Notify | None = None  # records why new replicas are withheld


@dataclass(frozen=True)
class DaemonSettings:
    pinned_limit_mib: int = 0
    # MPS roots looked through for daemons to adopt or retire beside the config's mpsRoot
    # (the --mps-root the node was deployed with).
    roots: tuple[str, ...] = ()
    budget: RestartBudget | None = None  # None: upstream's
    poll_s: float = POLL_S
    claims: bool = False  # the DRA claims' own daemons, not the resources'
    holder: str = "mps"  # who holds the GPUs of a daemon that does not serve its plan


REAL_TIME = Timing(time.monotonic, asyncio.sleep)


class MpsDaemons:
    def __init__(
        self,
        tools: MpsTools,
        options: DaemonSettings | None = None,  # None: the defaults
        timing: Timing = REAL_TIME,
    ) -> None:
        options = options or DaemonSettings()
        self.launcher, self.commands = tools.launcher, tools.commands
        self.pinned_limit_mib = options.pinned_limit_mib
        self.budget = options.budget or RestartBudget()
        self.poll_s = options.poll_s
        self.clock, self.sleep = timing.clock, timing.sleep
        self.notify = tools.notify
        self.claims, self.holder = options.claims, options.holder
        self.daemons: dict[str, _Supervisor] = {}
        self._roots = {r for r in options.roots if r}
        self._scanned: set[str] = set()
        self._hold: Hold | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()  # set, and replaced, on each change of a daemon

    def apply(self, plans: Iterable[DaemonPlan], hold: Hold, mps_root: str = "") -> None:
        """Want exactly the daemons of `plans`; returns at once (the supervisors do the
        work, holding each resource's GPUs until its daemon serves its plan)."""
        self._hold = hold
        wanted = {p.root: p for p in plans}
        for root in [r for r, s in self.daemons.items() if s.state is State.STOPPED]:
            del self.daemons[root]  # retired: a later plan gets a new supervisor
        for root, supervisor in self.daemons.items():
            if root not in wanted:
                self._want(supervisor, None)
        for root, plan in wanted.items():
            self._want(self._supervisor(root, plan.resource), plan)
        for root in ({mps_root} | self._roots) - self._scanned - {""}:
            self._scanned.add(root)
            self._spawn(self._adopt_unwanted(root))
        self.changed()

    @property
    def waiting(self) -> dict[str, str]:
        """resource -> why its new replicas are withheld (a daemon's clients to leave)."""
        return {
            s.name: s.waiting
            for s in self.daemons.values()
            if s.waiting and s.target.want is not None
        }

    def status(self) -> dict[str, str]:
        return {s.name: s.state.value for s in self.daemons.values()}

    async def close(self) -> None:
        """Stop supervising; every daemon keeps running for the next agent."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        supervisors, self.daemons = list(self.daemons.values()), {}
        left = [s.name for s in supervisors if s.target.running is not None]
        await asyncio.gather(*(s.stop() for s in supervisors))
        if left:
            log.info("mps_daemons_left_running", resources=",".join(left))
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
            for s in self.daemons.values()
            if s.target.want is not None and not s.up
            for u in s.target.want.gpu_uuids
        )
        if self._hold is not None:
            self._hold(down, by=self.holder)

    def notify_later(self, message: str) -> None:
        if self.notify is not None:
            self._spawn(self.notify(message))

    def _supervisor(self, root: str, resource: str) -> _Supervisor:
        if root not in self.daemons:
            self.daemons[root] = _Supervisor(_Daemon(root, resource, self), self)
        return self.daemons[root]

    def _want(self, supervisor: _Supervisor, plan: DaemonPlan | None) -> None:
        daemon = supervisor.target
        changed, daemon.want = plan != daemon.want, plan
        if supervisor.state is State.NEW:
            supervisor.begin()
        elif changed:
            supervisor.replan()

    async def _adopt_unwanted(self, mps_root: str) -> None:
        """Daemons found under `mps_root` that no plan wants: retired once idle."""
        try:
            found = await self.launcher.found(mps_root)
        except MpsError as exc:
            log.warning("mps_daemons_not_listed", mps_root=mps_root, error=str(exc))
            self._scanned.discard(mps_root)
            return
        for daemon in found:
            if daemon.root not in self.daemons and of_claim(daemon.root, mps_root) == self.claims:
                resource = posixpath.relpath(daemon.root, mps_root)
                log.info("mps_daemon_unwanted", resource=resource, pid=daemon.pid)
                self._want(self._supervisor(daemon.root, resource), None)

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
