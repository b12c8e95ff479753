"""services.mps: each resource's daemon supervised towards its plan, with behavioural
stand-ins for where daemons run (a launcher) and what they answer (commands): held
Unhealthy until serving, restarted within the budget, new limits without a restart,
replaced or quit only once its clients left, and left running when the agent stops."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuslice.core.mps import DaemonPlan, RunningDaemon
from gpuslice.core.ports import MpsError
from gpuslice.core.restart import RestartBudget
from gpuslice.services.mps import DaemonSettings, MpsDaemons, MpsTools
from gpuslice.services.supervision import Timing

ROOT = "/mps/nvidia.com/gpu"
PLAN = DaemonPlan("nvidia.com/gpu", ROOT, ("GPU-a", "GPU-b"), (100, 100), 50)
GPUS = frozenset(PLAN.gpu_uuids)


class Host:
    """Daemons by root, as a launcher and as the commands reaching them."""

    def __init__(self, *, failing: bool = False) -> None:
        self.failing = failing
        self.running: dict[str, RunningDaemon] = {}
        self.limits: dict[str, DaemonPlan] = {}
        self.clients: dict[str, int] = {}
        self.starts = 0
        self.quits = 0
        self.gate: asyncio.Event | None = None  # set: a start waits for it
        self.starting = asyncio.Event()  # a start was asked for
        self._exits: dict[int, asyncio.Event] = {}
        self._next = 100

    # the launcher
    async def start(self, plan: DaemonPlan) -> RunningDaemon:
        self.starts += 1
        self.starting.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.failing:
            raise MpsError("nvidia-cuda-mps-control -d exited with status 1")
        self._next += 1
        daemon = RunningDaemon(plan.root, self._next, plan.gpu_uuids)
        self.running[plan.root], self._exits[daemon.pid] = daemon, asyncio.Event()
        return daemon

    async def running_in(self, root: str) -> RunningDaemon | None:
        return self.running.get(root)

    async def found(self, mps_root: str) -> tuple[RunningDaemon, ...]:
        return tuple(d for r, d in self.running.items() if r.startswith(mps_root + "/"))

    async def exited(self, daemon: RunningDaemon) -> None:
        await self._exits[daemon.pid].wait()

    def crash(self, root: str) -> None:
        daemon = self.running.pop(root)
        self._exits[daemon.pid].set()

    # the commands
    async def limit(self, plan: DaemonPlan) -> None:
        self.limits[plan.root] = plan

    async def count(self, plan: DaemonPlan) -> int:
        return self.clients.get(plan.root, 0)

    async def quit(self, plan: DaemonPlan) -> None:
        assert not self.clients.get(plan.root), "quit under clients"
        self.quits += 1
        self.crash(plan.root)


class Launcher:
    def __init__(self, host: Host) -> None:
        self.start, self.found, self.exited = host.start, host.found, host.exited
        self.running = host.running_in


class Commands:
    def __init__(self, host: Host) -> None:
        self.limit, self.clients, self.quit = host.limit, host.count, host.quit


class Node:
    """The holds pushed, the Events recorded, and a clock that sleeps advance."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.held: list[frozenset[str]] = []
        self.events: list[str] = []
        self.now = 0.0
        self.pushed = asyncio.Event()

    def hold(self, held: frozenset[str], *, by: str) -> None:
        assert by == "mps"
        self.held.append(held)
        self.pushed.set()

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)  # the time passes at once; others run meanwhile

    async def record(self, message: str) -> None:
        self.events.append(message)

    def daemons(self, budget: RestartBudget | None = None) -> MpsDaemons:
        daemons = MpsDaemons(
            MpsTools(Launcher(self.host), Commands(self.host)),
            DaemonSettings(budget=budget),
            Timing(lambda: self.now, self.sleep),
        )
        daemons.notify = self.record
        return daemons


async def until(daemons: MpsDaemons, condition: Callable[[], bool]) -> None:
    """Wait for `condition`, looked at after each change of a daemon."""
    await asyncio.wait_for(daemons.settled(condition), 5)


async def left_running() -> Host:
    """A host whose daemon of PLAN an agent started, then stopped supervising."""
    host = Host()
    first = Node(host).daemons()
    first.apply([PLAN], Node(host).hold)
    await until(first, lambda: state(first) == "running")
    await first.close()
    return host


async def serving(host: Host) -> tuple[Node, MpsDaemons]:
    """Supervisors wanting PLAN on `host`, once its daemon serves."""
    node = Node(host)
    daemons = node.daemons()
    daemons.apply([PLAN], node.hold)
    await until(daemons, lambda: state(daemons) == "running")
    return node, daemons


def state(daemons: MpsDaemons) -> str:
    return daemons.status().get(PLAN.resource, "")


async def test_held_until_serving_and_left_running_when_the_agent_stops() -> None:
    host = Host()
    node = Node(host)
    daemons = node.daemons()
    daemons.apply([PLAN], node.hold)
    assert node.held[-1] == GPUS  # at once: no replica before its daemon
    await until(daemons, lambda: state(daemons) == "running")
    assert node.held[-1] == frozenset()
    assert host.limits[ROOT] == PLAN
    await daemons.close()
    assert ROOT in host.running
    assert host.quits == 0


async def test_apply_returns_while_a_daemon_is_still_starting() -> None:
    """The config apply path never waits on a daemon."""
    host = Host()
    host.gate = asyncio.Event()
    node = Node(host)
    daemons = node.daemons()
    daemons.apply([PLAN], node.hold)
    await asyncio.wait_for(host.starting.wait(), 5)
    assert state(daemons) == "starting"
    assert node.held[-1] == GPUS
    host.gate.set()
    await until(daemons, lambda: state(daemons) == "running")
    await daemons.close()


async def test_a_daemon_found_with_the_same_plan_is_adopted_not_restarted() -> None:
    host = await left_running()
    pid = host.running[ROOT].pid

    node = Node(host)
    second = node.daemons()
    second.apply([PLAN], node.hold, "/mps")
    await until(second, lambda: state(second) == "running")
    assert (host.starts, host.running[ROOT].pid) == (1, pid)
    await second.close()


async def test_new_limits_are_set_on_the_running_daemon() -> None:
    host = Host()
    node, daemons = await serving(host)
    host.clients[ROOT] = 2
    fewer = DaemonPlan(PLAN.resource, ROOT, PLAN.gpu_uuids, (200, 200), 100)
    daemons.apply([fewer], node.hold)
    await until(daemons, lambda: host.limits[ROOT] == fewer and state(daemons) == "running")
    assert (host.starts, host.quits) == (1, 0)
    assert node.held[-1] == frozenset()
    await daemons.close()


async def test_other_gpus_wait_for_the_clients_then_replace_the_daemon() -> None:
    host = Host()
    node, daemons = await serving(host)
    host.clients[ROOT] = 2
    moved = DaemonPlan(PLAN.resource, ROOT, ("GPU-a",), (100,), 50)
    daemons.apply([moved], node.hold)
    await until(daemons, lambda: state(daemons) == "waiting" and node.now >= 1.0)  # polled a while
    assert node.held[-1] == frozenset({"GPU-a"})
    assert daemons.waiting[PLAN.resource].startswith(
        "nvidia.com/gpu: new replicas withheld until the 2 clients of its MPS daemon (pid 101)"
    )
    assert node.events == [daemons.waiting[PLAN.resource]]  # one Event per wait
    assert host.quits == 0

    host.clients[ROOT] = 0
    await until(daemons, lambda: state(daemons) == "running")
    assert (host.quits, host.starts, host.running[ROOT].gpu_uuids) == (1, 2, ("GPU-a",))
    assert daemons.waiting == {}
    assert node.held[-1] == frozenset()
    await daemons.close()


async def test_unwanted_daemons_are_quit_once_idle_and_hold_nothing() -> None:
    host = await left_running()
    host.clients[ROOT] = 1

    node = Node(host)
    daemons = node.daemons()
    daemons.apply([], node.hold, "/mps")
    await until(daemons, lambda: state(daemons) == "waiting")
    assert (daemons.waiting, node.events, node.held[-1]) == ({}, [], frozenset())
    host.clients[ROOT] = 0
    await until(daemons, lambda: state(daemons) == "stopped")
    assert host.quits == 1
    assert ROOT not in host.running
    await daemons.close()


async def test_a_crash_holds_every_gpu_until_the_restart() -> None:
    host = Host()
    node, daemons = await serving(host)
    host.crash(ROOT)
    await until(daemons, lambda: host.starts == 2 and state(daemons) == "running")
    assert GPUS in node.held[1:]
    assert node.held[-1] == frozenset()
    await daemons.close()


async def test_a_daemon_that_never_starts_stays_held_once_the_budget_is_spent() -> None:
    host = Host(failing=True)
    node = Node(host)
    daemons = node.daemons(RestartBudget(max_restarts=2))
    daemons.apply([PLAN], node.hold)
    await until(daemons, lambda: state(daemons) == "failed")
    assert host.starts == 3  # the first start and two restarts
    assert node.held[-1] == GPUS
    host.failing = False  # a later config with another plan is tried afresh
    daemons.apply([DaemonPlan(PLAN.resource, ROOT, PLAN.gpu_uuids, (1, 1), 50)], node.hold)
    await until(daemons, lambda: state(daemons) == "running")
    await daemons.close()


async def test_the_nodes_daemons_and_the_dra_claims_own_leave_each_other_alone() -> None:
    host = Host()
    claim = DaemonPlan("dra-claims/uid-1", "/mps/dra-claims/uid-1", ("MIG-a",), (100,), 50)
    for plan in (PLAN, claim):
        await host.start(plan)
    node = Node(host)
    resources = node.daemons()
    resources.apply([], node.hold, "/mps")
    await until(resources, lambda: state(resources) == "stopped")
    assert list(host.running) == [claim.root]  # the resource's daemon quit, the claim's kept

    await host.start(PLAN)
    held: list[tuple[frozenset[str], str]] = []
    claims = MpsDaemons(
        MpsTools(Launcher(host), Commands(host)),
        DaemonSettings(claims=True, holder="mps-claims"),
        Timing(lambda: node.now, node.sleep),
    )
    claims.apply([], lambda devices, *, by: held.append((devices, by)), "/mps")
    await until(claims, lambda: claims.status() == {claim.resource: "stopped"})
    assert list(host.running) == [ROOT]
    assert held[-1] == (frozenset(), "mps-claims")
    await resources.close()
    await claims.close()
