"""The config manager's start against a Kubernetes API that is slow, away or erring: the
first reads (the ConfigMap's, the Node's) are tried again with jittered doubling back-off
on an injected clock until they work; meanwhile nothing is chosen, `status` names what is
waited for and the last error, the log has one line per kind of failure, and run() never
fails for it. MemoryNodeApi plays the API (its reads fail as an unreachable server's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import pytest
from structlog.testing import capture_logs

from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import LoadedConfig
from gpuslice.core.errors import BackendError
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.services.api_wait import ApiWait
from gpuslice.services.config_manager import ConfigInputs, ConfigManager, ConfigStatus
from gpuslice.services.config_source import ConfigMapEntries
from gpuslice.testing.nodeapi import MemoryNodeApi

NODE = "gpu-node-7"
NS, CM = "gpu-operator", "gpuslice-configs"
WITHIN_S = 10.0  # a hang detector: every step here takes milliseconds
UNREACHABLE = "Kubernetes API unreachable (simulated)"


def timeslicing(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )


def replicas(loaded: LoadedConfig) -> int:
    rules = resource_settings(loaded.config).sharing.rules
    return rules[0].replicas if rules else 1


class StepClock:
    """The retry's clock and sleep: each sleep is recorded, moves `now` on, and returns
    only once the test lets it (go)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[float] = []
        self._changed = asyncio.Condition()
        self._go = asyncio.Semaphore(0)

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        async with self._changed:
            self.delays.append(seconds)
            self.now += seconds
            self._changed.notify_all()
        await self._go.acquire()

    async def slept(self, count: int) -> None:
        async with asyncio.timeout(WITHIN_S), self._changed:
            await self._changed.wait_for(lambda: len(self.delays) >= count)

    def go(self) -> None:
        self._go.release()


class Applied:
    def __init__(self) -> None:
        self.replicas: list[int] = []
        self.served = asyncio.Event()

    async def __call__(self, settings: int) -> None:
        self.replicas.append(settings)
        self.served.set()


def manager(api: MemoryNodeApi, clock: StepClock, applied: Applied) -> ConfigManager[int]:
    wait = ApiWait(sleep=clock.sleep, clock=clock.time, draw=lambda _low, high: high)
    entries = ConfigMapEntries(api, NS, CM)
    return ConfigManager(ConfigInputs(api, NODE, entries, replicas), applied, api_wait=wait)


@contextlib.asynccontextmanager
async def running(
    mgr: ConfigManager[int],
) -> AsyncIterator[tuple[asyncio.Task[None], asyncio.Event]]:
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.run(stop))
    try:
        yield task, stop
    finally:
        stop.set()
        async with asyncio.timeout(WITHIN_S):
            await task


def waits(logs: list[dict[str, object]], event: str) -> list[dict[str, object]]:
    return [entry for entry in logs if entry["event"] == event]


async def test_an_api_away_at_start_is_waited_out_with_backoff_and_then_served() -> None:
    api = MemoryNodeApi({NODE: {DEFAULT_LABEL: "big"}})
    api.put_config_map(NS, CM, {"ts": timeslicing(2), "big": timeslicing(8)})
    api.set_reachable(False)
    clock, applied = StepClock(), Applied()
    mgr = manager(api, clock, applied)
    with capture_logs() as logs:
        async with running(mgr) as (task, _stop):
            for attempt in range(1, 7):
                await clock.slept(attempt)
                if attempt < 6:
                    clock.go()
            # doubling from 0.5 s to the 10 s cap, each drawn at its +20 % jitter bound
            assert clock.delays == pytest.approx([0.6, 1.2, 2.4, 4.8, 9.6, 12.0])
            assert mgr.status == ConfigStatus(
                None, False,
                f"waiting for the Kubernetes API to read ConfigMap {NS}/{CM} (attempt 6, "
                f"next in 12.0 s): read ConfigMap {NS}/{CM}: {UNREACHABLE}",
            )  # fmt: skip
            assert not task.done()
            assert applied.replicas == []
            assert not mgr.ready.is_set()
            api.set_reachable(True)
            clock.go()
            async with asyncio.timeout(WITHIN_S):
                await applied.served.wait()
            assert applied.replicas == [8]  # the entry the Node's label names
            assert mgr.status == ConfigStatus("big", True, f"label {DEFAULT_LABEL}=big")
    (line,) = waits(logs, "api_first_read_waiting")  # six attempts, one kind of failure
    assert line["attempt"] == 1
    assert line["error"] == f"read ConfigMap {NS}/{CM}: {UNREACHABLE}"
    (done,) = waits(logs, "api_first_read_done")
    assert done["attempts"] == 7
    assert done["waited_s"] == pytest.approx(sum(clock.delays))


class ErringNode(MemoryNodeApi):
    """The Node's first reads fail with the errors of `answers`, in order; the rest work."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__({NODE: {DEFAULT_LABEL: "ts"}})
        self.answers = answers

    async def watch_node_labels(self, node: str) -> AsyncGenerator[dict[str, str], None]:
        if self.answers:
            raise BackendError(f"read node {node}: {self.answers.pop(0)}", transient=True)
        async for labels in super().watch_node_labels(node):
            yield labels


async def test_the_node_read_waits_too_and_logs_one_line_per_kind_of_failure() -> None:
    answers = ["HTTP 503: unavailable"] * 3 + ["HTTP 429: too many requests"] * 2
    api = ErringNode(list(answers))
    api.put_config_map(NS, CM, {"ts": timeslicing(2)})
    clock, applied = StepClock(), Applied()
    mgr = manager(api, clock, applied)
    with capture_logs() as logs:
        async with running(mgr):
            for attempt in range(1, 6):
                await clock.slept(attempt)
                if attempt < 5:
                    clock.go()
            assert mgr.status.detail == (
                f"waiting for the Kubernetes API to read Node {NODE} (attempt 5, next in "
                f"9.6 s): read node {NODE}: HTTP 429: too many requests"
            )
            assert applied.replicas == []
            clock.go()
            async with asyncio.timeout(WITHIN_S):
                await applied.served.wait()
            assert applied.replicas == [2]
    lines = waits(logs, "api_first_read_waiting")
    assert [(w["attempt"], w["error"]) for w in lines] == [
        (1, f"read node {NODE}: HTTP 503: unavailable"),
        (4, f"read node {NODE}: HTTP 429: too many requests"),
    ]


async def test_a_stop_while_waiting_for_the_api_ends_run_quietly() -> None:
    api = MemoryNodeApi({NODE: {}})
    api.set_reachable(False)
    clock, applied = StepClock(), Applied()
    mgr = manager(api, clock, applied)
    async with running(mgr) as (task, stop):
        await clock.slept(1)
        stop.set()
        async with asyncio.timeout(WITHIN_S):
            await task  # returns: no error raised for an API that never answered
    assert applied.replicas == []
