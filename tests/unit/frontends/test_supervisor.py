"""One resource's supervisor, driven event by event against a scripted endpoint and
a clock whose timers fire only when a test fires them: each test walks the state
machine through one kind of fault and checks the endpoint calls it made."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gpuslice.core.errors import GpusliceError
from gpuslice.core.ports import SocketTaken
from gpuslice.core.restart import RestartBudget
from gpuslice.frontends.deviceplugin.supervisor import PluginSupervisor
from gpuslice.frontends.deviceplugin.supervisor_events import (
    Counters,
    KubeletRestarted,
    MayRegister,
    PluginState,
    SocketDeleted,
    Timing,
)

NAME = "example.com/widget"


class Timers:
    """The clock (`now`, moved by tests) and sleeps that end only when fired."""

    def __init__(self) -> None:
        self.now = 0.0
        self.requested: list[float] = []  # every delay asked for, in order
        self.pending: list[asyncio.Future[None]] = []
        self._added = asyncio.Event()

    def timing(self) -> Timing:
        return Timing(lambda: self.now, self.sleep)

    async def sleep(self, seconds: float) -> None:
        due = asyncio.get_running_loop().create_future()
        self.requested.append(seconds)
        self.pending.append(due)
        self._added.set()
        try:
            await due
        finally:
            self.pending.remove(due)

    async def delays(self, count: int) -> list[float]:
        """The first `count` delays asked for (waits for them)."""
        while len(self.requested) < count:
            self._added.clear()
            await self._added.wait()
        return self.requested[:count]

    def fire(self) -> None:
        for due in self.pending:
            if not due.done():
                due.set_result(None)


class Endpoint:
    """A PluginEndpoint whose starts fail as scripted, whose Register calls wait for
    the test's answer, and whose server can be made to go down."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.start_errors: list[Exception] = []  # raised by the next starts, in order
        self.answers: asyncio.Queue[Exception | None] = asyncio.Queue()
        self.registering = asyncio.Event()
        self.is_current = True
        self.present = False
        self._down: asyncio.Event = asyncio.Event()
        self.dropped = asyncio.Event()  # set: the kubelet cancels our stream
        self.drops_seen = asyncio.Event()

    async def start(self) -> None:
        self.calls.append("start")
        if self.start_errors:
            raise self.start_errors.pop(0)
        self.present, self._down = True, asyncio.Event()

    async def register(self) -> None:
        self.calls.append("register")
        self.registering.set()
        try:
            answer = await self.answers.get()
        finally:
            self.registering.clear()
        if answer is not None:
            raise answer

    def socket_present(self) -> bool:
        return self.present and not self._down.is_set()

    def current(self) -> bool:
        return self.socket_present() and self.is_current

    def down(self) -> str | None:
        return "it went down" if self._down.is_set() else None

    def release_socket(self) -> None:
        return None

    async def end_streams(self, timeout_s: float) -> bool:
        return True

    async def wait_dropped(self) -> None:
        await self.dropped.wait()
        self.dropped.clear()
        self.drops_seen.set()  # the supervisor is told in this same step

    async def wait_down(self) -> str:
        down = self._down
        await down.wait()
        return "it went down"

    async def stop(self) -> None:
        self.calls.append("stop")
        self.present = False

    def crash(self) -> None:
        self.present = False
        self._down.set()


class Harness:
    def __init__(self, budget: RestartBudget, may_register: asyncio.Event | None = None) -> None:
        self.endpoint, self.timers, self.counters = Endpoint(), Timers(), Counters()
        self.gave_up: list[tuple[str, int, str]] = []
        self.supervisor = PluginSupervisor(
            NAME,
            self.endpoint,
            budget=budget,
            timing=self.timers.timing(),
            counters=self.counters,
            on_failed=lambda *why: self.gave_up.append(why),
            may_register=may_register,
        )

    async def registered(self) -> None:
        """Start, and have the first Register call accepted."""
        starting = asyncio.create_task(self.supervisor.start())
        await self.endpoint.registering.wait()
        self.endpoint.answers.put_nowait(None)
        await starting
        assert self.supervisor.state is PluginState.REGISTERED

    async def reached(self, state: PluginState) -> None:
        async with asyncio.timeout(5):
            await self.supervisor.reached(state)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness(RestartBudget(max_restarts=2, window_s=60.0))
    yield harness
    await harness.supervisor.stop()
    assert harness.supervisor.state is PluginState.STOPPED


async def test_a_new_resource_is_served_then_registered(h: Harness) -> None:
    await h.registered()
    assert h.endpoint.calls == ["start", "register"]
    assert h.counters.registrations == 1


async def test_a_register_call_the_kubelet_did_not_take_is_retried_on_its_backoff(
    h: Harness,
) -> None:
    starting = asyncio.create_task(h.supervisor.start())
    for n in (1, 2):
        await h.endpoint.registering.wait()
        h.endpoint.answers.put_nowait(GpusliceError("no kubelet yet"))
        await h.reached(PluginState.SERVING)
        await starting  # the first attempt is over: start() returns
        await h.timers.delays(n)
        h.timers.fire()
    assert h.timers.requested == [0.5, 1.0]
    await h.endpoint.registering.wait()
    h.endpoint.answers.put_nowait(None)
    await h.reached(PluginState.REGISTERED)
    assert h.endpoint.calls == ["start", "register", "register", "register"]


async def test_a_kubelet_restart_re_serves_unless_registered_with_that_kubelet(
    h: Harness,
) -> None:
    await h.registered()
    await h.supervisor.send(KubeletRestarted())  # our registration went to it
    assert h.endpoint.calls == ["start", "register"]

    h.endpoint.is_current = False  # a new kubelet.sock
    await h.supervisor.send(KubeletRestarted())
    assert h.supervisor.state is PluginState.REGISTERING
    assert h.endpoint.calls == ["start", "register", "stop", "start", "register"]


async def test_a_restart_abandons_the_register_call_in_flight(h: Harness) -> None:
    starting = asyncio.create_task(h.supervisor.start())
    await h.endpoint.registering.wait()
    h.endpoint.present = False  # our socket deleted while the kubelet holds the call
    await h.supervisor.send(SocketDeleted())
    await h.endpoint.registering.wait()  # a new call, on a new socket
    h.endpoint.answers.put_nowait(None)
    await starting
    assert h.supervisor.state is PluginState.REGISTERED
    assert h.endpoint.calls == ["start", "register", "stop", "start", "register"]
    assert h.counters.registrations == 1


async def test_a_stream_the_kubelet_cancels_is_registered_again_at_once(h: Harness) -> None:
    await h.registered()
    h.endpoint.dropped.set()  # an older stream of the resource ended: we were dropped
    await h.endpoint.registering.wait()  # at once, on the same server, no timer
    assert h.timers.requested == []
    h.endpoint.answers.put_nowait(None)
    await h.reached(PluginState.REGISTERED)
    assert h.endpoint.calls == ["start", "register", "register"]
    assert h.counters.registrations == 2

    h.endpoint.drops_seen.clear()
    h.endpoint.is_current = False  # kubelet.sock re-created: a restart, left to its event
    h.endpoint.dropped.set()
    await h.endpoint.drops_seen.wait()
    await h.supervisor.send(SocketDeleted())  # handled after the drop
    assert h.endpoint.calls == ["start", "register", "register"]


async def test_the_deletion_of_an_older_socket_file_is_no_loss(h: Harness) -> None:
    await h.registered()
    await h.supervisor.send(SocketDeleted())  # ours is in place
    assert h.supervisor.state is PluginState.REGISTERED
    assert h.endpoint.calls == ["start", "register"]


async def test_a_server_that_goes_down_comes_back_after_its_backoff_only(h: Harness) -> None:
    await h.registered()
    h.endpoint.crash()
    await h.reached(PluginState.BACKING_OFF)
    assert await h.timers.delays(1) == [0.1]
    await h.supervisor.send(SocketDeleted())  # its dying socket: not a second failure
    await h.supervisor.send(KubeletRestarted())  # nor a reason to come back sooner
    assert h.endpoint.calls == ["start", "register", "stop"]
    assert h.counters.server_failures == 1

    h.timers.fire()
    await h.endpoint.registering.wait()
    h.endpoint.answers.put_nowait(None)
    await h.reached(PluginState.REGISTERED)
    assert h.endpoint.calls == ["start", "register", "stop", "start", "register"]


async def test_failures_in_a_row_spend_the_budget_and_nothing_restarts_after(
    h: Harness,
) -> None:
    h.endpoint.start_errors = [GpusliceError(f"bind failed {n}") for n in range(3)]
    await h.supervisor.start()
    for n in (1, 2):
        await h.reached(PluginState.BACKING_OFF)
        await h.timers.delays(n)
        h.timers.now += 59  # each within the window of the last
        h.timers.fire()
    await h.reached(PluginState.FAILED)
    assert h.timers.requested == [0.1, 0.2]
    assert h.gave_up == [(NAME, 3, "bind failed 2")]
    await h.supervisor.send(KubeletRestarted())
    assert h.endpoint.calls.count("start") == 3
    assert h.timers.pending == []


async def test_a_socket_another_plugin_serves_is_waited_for_and_costs_nothing(
    h: Harness,
) -> None:
    h.endpoint.start_errors = [SocketTaken("another device plugin serves it")] * 2
    await h.supervisor.start()
    assert h.supervisor.state is PluginState.BLOCKED
    await h.timers.delays(1)
    h.timers.fire()  # looked at again: still taken
    await h.timers.delays(2)
    assert h.supervisor.state is PluginState.BLOCKED
    assert h.timers.requested == [0.5, 1.0]
    assert h.endpoint.calls == ["start", "start"]

    await h.supervisor.send(SocketDeleted())  # the other plugin's socket went
    assert h.supervisor.state is PluginState.REGISTERING
    assert h.counters.server_failures == 0
    assert h.gave_up == []


async def test_a_held_resource_serves_unregistered_until_it_may_register() -> None:
    """A successor whose predecessor still streams: the server starts and start()
    returns with nothing registered, a kubelet restart meanwhile re-serves it still
    unregistered, and MayRegister registers it once."""
    may_register = asyncio.Event()
    h = Harness(RestartBudget(max_restarts=2, window_s=60.0), may_register)
    await h.supervisor.start()
    assert h.supervisor.state is PluginState.SERVING
    h.endpoint.is_current = False
    await h.supervisor.send(KubeletRestarted())
    assert h.supervisor.state is PluginState.SERVING
    assert h.endpoint.calls == ["start", "stop", "start"]

    may_register.set()
    await h.supervisor.send(MayRegister())
    await h.endpoint.registering.wait()
    h.endpoint.answers.put_nowait(None)
    await h.reached(PluginState.REGISTERED)
    await h.supervisor.send(MayRegister())  # once registered, nothing more
    assert h.endpoint.calls == ["start", "stop", "start", "register"]
    assert h.timers.requested == []
    await h.supervisor.stop()
