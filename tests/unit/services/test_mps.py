"""services.mps: daemons held Unhealthy until they answer, restarted within the
budget, stopped when their resource goes; with a behavioural stand-in for a daemon."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpuslice.core.mps import DaemonPlan
from gpuslice.core.ports import MpsError
from gpuslice.core.restart import RestartBudget
from gpuslice.services.mps import MpsDaemons

PLAN = DaemonPlan("nvidia.com/gpu", "/mps/nvidia.com/gpu", ("GPU-a", "GPU-b"), (100, 100), 50)


class Daemon:
    """Starts unless told to fail; `crash()` makes it exit."""

    def __init__(self, plan: DaemonPlan, failing: bool) -> None:
        self.plan = plan
        self.failing = failing
        self.starts = 0
        self.running = False
        self._exit = asyncio.Event()

    async def start(self) -> None:
        self.starts += 1
        if self.failing:
            raise MpsError("nvidia-cuda-mps-control -d exited with status 1")
        self.running, self._exit = True, asyncio.Event()

    async def quit(self) -> None:
        self.crash()

    def pid(self) -> int | None:
        return 1 if self.running else None

    async def exited(self) -> None:
        await self._exit.wait()

    def crash(self) -> None:
        self.running = False
        self._exit.set()


class Node:
    """The daemons made, the holds pushed, and a clock that sleeps advance."""

    def __init__(self, *, failing: bool = False) -> None:
        self.failing = failing
        self.made: list[Daemon] = []
        self.held: list[frozenset[str]] = []
        self.now = 0.0
        self.pushed = asyncio.Event()

    def control(self, plan: DaemonPlan) -> Daemon:
        self.made.append(Daemon(plan, self.failing))
        return self.made[-1]

    def hold(self, held: frozenset[str], *, by: str) -> None:
        assert by == "mps"
        self.held.append(held)
        self.pushed.set()

    async def sleep(self, seconds: float) -> None:
        self.now += seconds  # the backoff passes at once

    def daemons(self, budget: RestartBudget | None = None) -> MpsDaemons:
        return MpsDaemons(self.control, budget=budget, clock=lambda: self.now, sleep=self.sleep)


async def until(node: Node, condition: Callable[[], bool]) -> None:
    """Wait for `condition`, re-checked each time a hold is pushed."""
    while not condition():
        node.pushed.clear()
        await asyncio.wait_for(node.pushed.wait(), 5)


async def test_started_before_apply_returns_and_released_once_up() -> None:
    node = Node()
    daemons = node.daemons()
    await daemons.apply([PLAN], node.hold)
    assert node.made[0].running
    assert node.held[-1] == frozenset()
    await daemons.close()
    assert not node.made[0].running


async def test_a_crash_holds_every_gpu_until_the_restart() -> None:
    node = Node()
    daemons = node.daemons()
    await daemons.apply([PLAN], node.hold)
    node.made[0].crash()
    await until(node, lambda: node.made[0].starts == 2 and node.made[0].running)
    assert frozenset({"GPU-a", "GPU-b"}) in node.held
    assert node.held[-1] == frozenset()
    await daemons.close()


async def test_a_daemon_that_never_starts_stays_held_once_the_budget_is_spent() -> None:
    node = Node(failing=True)
    daemons = node.daemons(RestartBudget(max_restarts=2))
    await daemons.apply([PLAN], node.hold)
    assert node.held[-1] == frozenset({"GPU-a", "GPU-b"})
    await until(node, lambda: daemons.daemons["nvidia.com/gpu"].gave_up)
    assert node.made[0].starts == 3  # the first start and two restarts
    assert node.held[-1] == frozenset({"GPU-a", "GPU-b"})
    await daemons.close()


async def test_a_resource_that_goes_stops_its_daemon_and_a_changed_plan_restarts_it() -> None:
    node = Node()
    daemons = node.daemons()
    await daemons.apply([PLAN], node.hold)
    changed = DaemonPlan(PLAN.resource, PLAN.root, PLAN.gpu_uuids, (50, 50), 25)
    await daemons.apply([changed], node.hold)
    assert [d.running for d in node.made] == [False, True]
    await daemons.apply([], node.hold)
    assert not node.made[1].running
    assert daemons.daemons == {}
