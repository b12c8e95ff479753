"""Hypothesis on the wire: arbitrary device ID lists and sizes sent to a running
agent over its real plugin socket. Each call gets either INVALID_ARGUMENT with one
short line, exactly when an independent check says the request is malformed, or a
correct answer; the agent keeps serving throughout."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import pytest
from agent_harness import EXAMPLES, GPU, AgentLauncher, gpus_of, remove_dir, short_dir
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuslice.adapters.deviceplugin.api import pb, pb_grpc, unix_target
from gpuslice.adapters.deviceplugin.servicer import MAX_DETAIL_CHARS
from gpuslice.testing.kubelet import KubeletStandin

FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
START_TIMEOUT_S = 15.0
T = TypeVar("T")


class AgentThread:
    """The kubelet stand-in and an agent (t4x4, 4 replicas per GPU) on their own
    event loop in a thread, so synchronous hypothesis tests can call the socket."""

    def __init__(self) -> None:
        self.plugin_dir = short_dir("gsf-")
        self.ids: list[str] = []
        self.socket = ""
        self.failure: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="fuzz-agent")

    def __enter__(self) -> AgentThread:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S) or self.failure is not None:
            self.__exit__()
            raise RuntimeError(f"agent did not start: {self.failure!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT_S)
        remove_dir(self.plugin_dir)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test through `failure`
            self.failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        launcher = AgentLauncher(self.plugin_dir)
        try:
            async with KubeletStandin(self.plugin_dir) as kubelet:
                running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
                await running.registered(kubelet)
                self.ids = sorted(kubelet.devices(GPU))
                self.socket = running.socket("nvidia-gpu.sock")
                self._ready.set()
                await self._stop.wait()
                assert not running.task.done(), "the agent stopped while being fuzzed"
        finally:
            await launcher.close()


@pytest.fixture(scope="module")
def agent() -> Iterator[AgentThread]:
    with AgentThread() as running:
        yield running


@pytest.fixture(scope="module")
def stub(agent: AgentThread) -> Iterator[pb_grpc.DevicePluginStub]:
    with grpc.insecure_channel(unix_target(agent.socket)) as channel:
        yield pb_grpc.DevicePluginStub(channel)


def _ids(known: list[str]) -> st.SearchStrategy[list[str]]:
    """Half the time distinct known IDs; otherwise known IDs with repeats, near misses
    and arbitrary text mixed in."""
    odd = st.one_of(
        st.text(max_size=40),
        st.sampled_from(["", "::0", "GPU-", "MIG-0", known[0] + "::9", known[0].upper()]),
    )
    return st.one_of(
        st.lists(st.sampled_from(known), unique=True, max_size=len(known)),
        st.lists(st.one_of(st.sampled_from(known), odd), max_size=24),
    )


def _sizes(low: int, high: int) -> st.SearchStrategy[int]:
    """Mostly a size from `low` to `high` (when that is a range), sometimes any int32."""
    anything = st.integers(-(2**31), 2**31 - 1)
    return st.one_of(st.integers(low, high), anything) if low <= high else anything


def _well_formed(ids: list[str], known: set[str]) -> bool:
    return set(ids) <= known and len(set(ids)) == len(ids)


def _refusal(exc: grpc.RpcError) -> str:
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
    details = exc.details() or ""
    assert details
    assert "\n" not in details
    assert len(details) <= MAX_DETAIL_CHARS + 40
    return details


def _call(fn: Callable[[], T]) -> T | grpc.RpcError:
    """The answer, or the RPC error it raised."""
    try:
        return fn()
    except grpc.RpcError as exc:
        return exc


@FUZZ
@given(data=st.data())
def test_preferred_allocation_answers_or_refuses_exactly_the_malformed(
    agent: AgentThread, stub: pb_grpc.DevicePluginStub, data: st.DataObject
) -> None:
    known = set(agent.ids)
    available = data.draw(_ids(agent.ids), "available")
    subset = st.lists(st.sampled_from(available), unique=True) if available else st.just([])
    must = data.draw(st.one_of(st.just([]), subset, _ids(agent.ids)), "must_include")
    size = data.draw(_sizes(max(len(must), 1), len(available)), "size")
    valid = (
        size >= 1
        and _well_formed(available, known)
        and _well_formed(must, known)
        and set(must) <= set(available)
        and len(must) <= size <= len(available)
    )
    event("well-formed" if valid else "malformed")
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    resp = _call(lambda: stub.GetPreferredAllocation(request, timeout=10))
    if isinstance(resp, grpc.RpcError):
        assert not valid, f"a well-formed request was refused: {_refusal(resp)}"
        return
    assert valid, "a malformed request was answered"
    (answer,) = resp.container_responses
    got = list(answer.deviceIDs)
    assert len(got) == len(set(got)) == size
    assert set(must) <= set(got) <= set(available)


@FUZZ
@given(data=st.data())
def test_allocate_answers_or_refuses_exactly_the_malformed(
    agent: AgentThread, stub: pb_grpc.DevicePluginStub, data: st.DataObject
) -> None:
    known = set(agent.ids)
    containers = data.draw(st.lists(_ids(agent.ids), max_size=3), "containers")
    valid = all(ids and _well_formed(ids, known) for ids in containers)
    event("well-formed" if valid else "malformed")
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )
    resp = _call(lambda: stub.Allocate(request, timeout=10))
    if isinstance(resp, grpc.RpcError):
        assert not valid, f"a well-formed request was refused: {_refusal(resp)}"
        return
    assert valid, "a malformed request was answered"
    assert len(resp.container_responses) == len(containers)
    for ids, answer in zip(containers, resp.container_responses, strict=True):
        assert set(answer.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == gpus_of(ids)


def test_the_agent_still_serves_a_good_request_after_the_fuzzing(
    agent: AgentThread, stub: pb_grpc.DevicePluginStub
) -> None:
    """Runs after the fuzz tests in this module (file order)."""
    one = pb.ContainerAllocateRequest(devices_ids=agent.ids[:1])
    resp = stub.Allocate(pb.AllocateRequest(container_requests=[one]), timeout=5)
    (visible,) = gpus_of(agent.ids[:1])
    assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == visible
    assert agent.failure is None
