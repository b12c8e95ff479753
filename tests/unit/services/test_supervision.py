"""The node's one supervision idiom (services.supervision) on a plain target, as an MPS
control daemon uses it: started, restarted after a backoff when it goes down on its own
or cannot start, given up once the restart budget is spent, stopped from any state.
Timers fire only when the test fires them."""

from __future__ import annotations

import asyncio

from gpuslice.core.restart import RestartBudget
from gpuslice.services.supervision import State, Supervisor, Timing


class Target:
    """A daemon whose starts fail as scripted and which can be made to exit."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.start_errors: list[Exception] = []
        self._exited = asyncio.Event()

    async def start(self) -> None:
        self.calls.append("start")
        if self.start_errors:
            raise self.start_errors.pop(0)
        self._exited = asyncio.Event()

    def down(self) -> str | None:
        return "exited with status 1" if self._exited.is_set() else None

    async def wait_down(self) -> str:
        await self._exited.wait()
        return "exited with status 1"

    async def stop(self) -> None:
        self.calls.append("stop")

    def exit(self) -> None:
        self._exited.set()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[float] = []
        self._due: asyncio.Queue[asyncio.Future[None]] = asyncio.Queue()

    def timing(self) -> Timing:
        return Timing(lambda: self.now, self.sleep)

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        due = asyncio.get_running_loop().create_future()
        self._due.put_nowait(due)
        await due

    async def fire(self) -> None:
        (await asyncio.wait_for(self._due.get(), 5)).set_result(None)


def supervised(
    target: Target,
    clock: Clock,
    failed: list[str],
    restarts: int = 2,
    states: list[State] | None = None,
) -> Supervisor:
    budget = RestartBudget(max_restarts=restarts, window_s=3600.0)
    return Supervisor(
        "nvidia.com/gpu", target, budget=budget, timing=clock.timing(),
        on_failed=lambda name, count, why: failed.append(f"{name} {count} {why}"),
        on_state=None if states is None else states.append,
    )  # fmt: skip


async def test_a_target_that_exits_is_started_again_after_its_backoff() -> None:
    target, clock, failed, states = Target(), Clock(), [], []
    sup = supervised(target, clock, failed, states=states)
    await sup.start()
    assert sup.state is State.RUNNING
    target.exit()
    assert await asyncio.wait_for(sup.reached(State.BACKING_OFF), 5) is State.BACKING_OFF
    await clock.fire()
    assert await asyncio.wait_for(sup.reached(State.RUNNING), 5) is State.RUNNING
    assert target.calls == ["start", "stop", "start"]
    await sup.stop()
    assert (sup.state, target.calls[-1], failed) == (State.STOPPED, "stop", [])
    # what an owner holding the target's GPUs while it is not RUNNING is told, in order
    assert states == [State.STARTING, State.RUNNING, State.BACKING_OFF, State.STARTING,
                      State.RUNNING, State.STOPPED]  # fmt: skip


async def test_starts_that_fail_spend_the_budget_and_then_it_gives_up() -> None:
    target, clock, failed = Target(), Clock(), []
    target.start_errors = [RuntimeError("no such binary")] * 3
    sup = supervised(target, clock, failed, restarts=2)
    await sup.start()
    assert sup.state is State.BACKING_OFF
    await clock.fire()
    await clock.fire()
    assert await asyncio.wait_for(sup.reached(State.FAILED), 5) is State.FAILED
    assert failed == ["nvidia.com/gpu 3 no such binary"]
    assert len(clock.delays) == 2
    assert clock.delays[0] < clock.delays[1]  # backing off more each time
    await sup.stop()
    assert sup.state is State.STOPPED
