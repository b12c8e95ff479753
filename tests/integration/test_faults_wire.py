"""Bad input on the wire, through the real plugin socket: every malformed
GetPreferredAllocation and Allocate gets INVALID_ARGUMENT with a one-line message
naming the problem (or, where the request is merely empty, a correct empty
answer); absurdly large requests are refused cleanly; and a storm of good and bad
calls from many clients leaves the agent serving everyone, with sane latency."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence

import grpc
import pytest
from agent_harness import EXAMPLES, GPU, AgentLauncher, RunningAgent, gpus_of
from faults_harness import Census, no_leaks, summary_ms

from gpuslice.adapters.deviceplugin.api import pb, pb_grpc, unix_target
from gpuslice.adapters.deviceplugin.server import MAX_REQUEST_BYTES
from gpuslice.adapters.deviceplugin.servicer import MAX_DETAIL_CHARS
from gpuslice.testing.kubelet import KubeletStandin

CHANNELS, CALLS_PER_CHANNEL = 50, 200


def _preferred(
    available: Sequence[str], must: Sequence[str] = (), size: int = 1, containers: int = 1
) -> pb.PreferredAllocationRequest:
    one = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
    )
    return pb.PreferredAllocationRequest(container_requests=[one] * containers)


def _allocate(*containers: Sequence[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )


async def _t4x4(kubelet: KubeletStandin, launcher: AgentLauncher) -> tuple[RunningAgent, list[str]]:
    """t4x4 time-sliced: 16 replicas, 4 per GPU."""
    running = await launcher.start("t4x4", config=EXAMPLES / "time-slicing.yaml")
    await running.registered(kubelet)
    return running, sorted(kubelet.devices(GPU))


async def _refused(call: object, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> str:
    """Await a call that must fail with `code`; returns its one-line message."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call  # type: ignore[misc]
    assert failed.value.code() == code, failed.value
    details = failed.value.details() or ""
    assert details
    assert "\n" not in details
    return details


def _bad_preferred(ids: list[str]) -> dict[str, tuple[pb.PreferredAllocationRequest, str]]:
    a, b, c, d = ids[:4]
    return {
        "unknown available ID": (
            _preferred([a, "GPU-nope::0"], size=1),
            "available devices: unknown device 'GPU-nope::0' for nvidia.com/gpu",
        ),
        "duplicate available ID": (
            _preferred([a, a, b], size=2),
            f"available devices: device '{a}' listed more than once",
        ),
        "unknown must-include ID": (
            _preferred([a, b], ["GPU-nope::1"], 2),
            "must-include devices: unknown device 'GPU-nope::1'",
        ),
        "duplicate must-include ID": (
            _preferred([a, b], [a, a], 2),
            f"must-include devices: device '{a}' listed more than once",
        ),
        "must-include not available": (
            _preferred([b, c], [a], 2),
            f"must-include device '{a}' is not among the available ones",
        ),
        "more must-include than size": (
            _preferred([a, b, c], [a, b], 1),
            "2 must-include devices exceed the allocation size 1",
        ),
        "size 0": (_preferred([a, b], size=0), "allocation size must be at least 1, got 0"),
        "negative size": (
            _preferred([a, b], size=-3),
            "allocation size must be at least 1, got -3",
        ),
        "size above available": (
            _preferred([a, b, c, d], size=5),
            "not enough available devices to satisfy allocation: 5 requested, 4 available",
        ),
        "nothing available": (_preferred([], size=1), "1 requested, 0 available"),
        "a bad second container": (
            pb.PreferredAllocationRequest(
                container_requests=[
                    _preferred([a, b], size=1).container_requests[0],
                    _preferred([c, c], size=1).container_requests[0],
                ]
            ),
            f"device '{c}' listed more than once",
        ),
    }


def _bad_allocate(ids: list[str]) -> dict[str, tuple[pb.AllocateRequest, str]]:
    a, b = ids[:2]
    return {
        "unknown ID": (_allocate([a, "GPU-nope::0"]), "unknown device 'GPU-nope::0'"),
        "duplicate ID": (_allocate([a, b, a]), f"device '{a}' listed more than once"),
        "container with no IDs": (_allocate([]), "empty container request for nvidia.com/gpu"),
        "a bad second container": (_allocate([a], []), "empty container request"),
    }


async def test_each_malformed_request_gets_invalid_argument_naming_the_problem(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running, ids = await _t4x4(kubelet, launcher)
    stub = kubelet.plugin_stub(GPU)
    for what, (preferred, expected) in _bad_preferred(ids).items():
        details = await _refused(stub.GetPreferredAllocation(preferred, timeout=5))
        assert expected in details, (what, details)
    for what, (allocate, expected) in _bad_allocate(ids).items():
        details = await _refused(stub.Allocate(allocate, timeout=5))
        assert expected in details, (what, details)
    assert not running.task.done()
    assert [r.resource for r in kubelet.registrations] == [GPU]


async def test_empty_and_exact_requests_get_correct_answers(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    _, ids = await _t4x4(kubelet, launcher)
    stub = kubelet.plugin_stub(GPU)
    assert not (await stub.Allocate(_allocate(), timeout=5)).container_responses
    none = await stub.GetPreferredAllocation(pb.PreferredAllocationRequest(), timeout=5)
    assert not none.container_responses

    everything = await stub.GetPreferredAllocation(_preferred(ids, size=16), timeout=5)
    assert sorted(everything.container_responses[0].deviceIDs) == ids
    pinned = await stub.GetPreferredAllocation(_preferred(ids, ids[5:7], 2), timeout=5)
    assert list(pinned.container_responses[0].deviceIDs) == ids[5:7]
    two = await stub.GetPreferredAllocation(_preferred(ids, size=2, containers=3), timeout=5)
    assert len(two.container_responses) == 3
    answer = await stub.Allocate(_allocate(ids[:1], ids[4:6]), timeout=5)
    visible = [r.envs["NVIDIA_VISIBLE_DEVICES"].split(",") for r in answer.container_responses]
    assert [set(v) for v in visible] == [gpus_of(ids[:1]), gpus_of(ids[4:6])]


async def test_very_large_requests_are_refused_cleanly_and_quickly(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running, ids = await _t4x4(kubelet, launcher)
    stub = kubelet.plugin_stub(GPU)
    took: dict[str, float] = {}

    async def refused(what: str, call: object, expected: str, **kw: grpc.StatusCode) -> str:
        started = time.monotonic()
        details = await _refused(call, **kw)
        took[what] = time.monotonic() - started
        assert expected in details, (what, details[:200])
        assert len(details) <= MAX_DETAIL_CHARS + 40, what
        return details

    many = [f"GPU-{i:08d}::0" for i in range(100_000)]
    await refused("100,000 unknown IDs", stub.Allocate(_allocate(many)), "unknown device")
    await refused(
        "60,000 repeated IDs in available",
        stub.GetPreferredAllocation(_preferred(ids * 3750, size=2)),
        "listed more than once",
    )
    for length in (10_000, 1_000_000):
        details = await refused(
            f"an ID of {length:,} characters",
            stub.Allocate(_allocate(["G" * length])),
            "unknown device 'GGG",
        )
        assert "characters cut]" in details
        assert details.endswith("' for nvidia.com/gpu")
    over = [ids[0]] * (MAX_REQUEST_BYTES // len(ids[0]) + 1)
    await refused(
        "a request over the size limit",
        stub.Allocate(_allocate(over)),
        "Received message larger than max (",
        code=grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    print("; ".join(f"{what}: {s * 1000:.0f} ms" for what, s in took.items()))
    assert max(took.values()) < 2.0
    assert not running.task.done()
    (admitted,) = await kubelet.admit("after", {"main": {GPU: 1}})
    assert admitted.allocation.envs["NVIDIA_VISIBLE_DEVICES"] == gpus_of(admitted.device_ids).pop()


async def _client(socket: str, ids: list[str], seed: int, latencies: list[float]) -> int:
    """One client on its own connection: CALLS_PER_CHANNEL calls, a third of them
    malformed; checks every answer; returns how many were refused."""
    rng = random.Random(seed)
    refused = 0
    async with grpc.aio.insecure_channel(unix_target(socket)) as channel:
        stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
        for _ in range(CALLS_PER_CHANNEL):
            kind = rng.randrange(6)
            started = time.monotonic()
            if kind == 0:
                size = rng.randint(1, 3)
                resp = await stub.GetPreferredAllocation(_preferred(ids, size=size), timeout=10)
                got = list(resp.container_responses[0].deviceIDs)
                assert len(set(got)) == size
                assert set(got) <= set(ids)
            elif kind in (1, 2):
                chosen = rng.sample(ids, rng.randint(1, 3))
                resp_a = await stub.Allocate(_allocate(chosen), timeout=10)
                visible = resp_a.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
                assert set(visible.split(",")) == gpus_of(chosen)
            else:
                bad = [
                    stub.Allocate(_allocate([ids[0], "nope"]), timeout=10),
                    stub.Allocate(_allocate([]), timeout=10),
                    stub.GetPreferredAllocation(_preferred(ids, size=0), timeout=10),
                ][kind - 3]
                await _refused(bad)
                refused += 1
            latencies.append(time.monotonic() - started)
    return refused


async def _round_trip(
    stub: pb_grpc.DevicePluginAsyncStub, ids: list[str], n: int = 50
) -> list[float]:
    out = []
    for _ in range(n):
        started = time.monotonic()
        await stub.Allocate(_allocate(ids[:1]), timeout=5)
        out.append(time.monotonic() - started)
    return out


async def test_a_storm_of_good_and_bad_calls_from_many_clients_leaves_everyone_served(
    kubelet: KubeletStandin, launcher: AgentLauncher
) -> None:
    running, ids = await _t4x4(kubelet, launcher)
    socket = running.socket("nvidia-gpu.sock")
    stub = kubelet.plugin_stub(GPU)
    await _client(socket, ids, -1, [])  # warm-up: one client's worth, before the census
    before = Census.take()
    quiet = await _round_trip(stub, ids)

    latencies: list[float] = []
    started = time.monotonic()
    clients = [_client(socket, ids, seed, latencies) for seed in range(CHANNELS)]
    refused = sum(await asyncio.gather(*clients))
    elapsed = time.monotonic() - started
    after = await _round_trip(stub, ids)

    total = CHANNELS * CALLS_PER_CHANNEL
    print(
        f"storm: {total} calls from {CHANNELS} clients in {elapsed:.1f} s "
        f"({total / elapsed:.0f}/s), {refused} refused; per call {summary_ms(latencies)}; "
        f"a lone Allocate before {summary_ms(quiet)}, after {summary_ms(after)}"
    )
    assert len(latencies) == total
    assert total / 4 < refused < total * 3 / 4
    assert max(latencies) < 2.0  # 50 calls in flight at once, clients in this process too
    assert statistics.median(after) < max(5 * statistics.median(quiet), 0.005)
    assert not running.task.done()
    assert [r.resource for r in kubelet.registrations] == [GPU]
    (admitted,) = await kubelet.admit("after-storm", {"main": {GPU: 1}})
    assert len(admitted.device_ids) == 1
    await no_leaks(before)
