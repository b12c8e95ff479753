"""gRPC requests from the kubelet's side, hostile or huge, over the real unix socket: a
GetPreferredAllocation naming 8,192 must-include devices answers in one pass and leaves
a concurrent Allocate unblocked; random requests (hypothesis) end as an answer or
INVALID_ARGUMENT, never INTERNAL, and the agent keeps serving; a config whose
ListAndWatch the kubelet could not receive is refused with one line naming the limit."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import GPU, AgentLauncher, RunningAgent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.adapters.deviceplugin.api import pb
from gpuslice.adapters.deviceplugin.convert import device_list
from gpuslice.adapters.deviceplugin.servicer import MAX_CONTAINER_REQUESTS
from gpuslice.core.resources import AdvertisedDevice, list_and_watch_bytes
from gpuslice.testing.kubelet import KubeletStandin

from .invariant import RSS_GROWTH_LIMIT, answers_allocate, rss_bytes

REPLICAS = 1024


def config(tmp_path: Path, replicas: int) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\nflags:\n  migStrategy: single\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
    return path


async def big_node(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> RunningAgent:
    running = await launcher.start("dgx-a100", config=config(tmp_path, REPLICAS))
    await running.registered(kubelet, 20)
    return running


async def test_8192_must_include_devices_answer_at_once_and_allocate_is_not_blocked(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    await big_node(launcher, kubelet, tmp_path)
    ids = sorted(kubelet.devices(GPU))
    assert len(ids) == 8 * REPLICAS
    big = asyncio.ensure_future(kubelet.preferred_allocation(GPU, ids, ids, len(ids)))
    started = time.perf_counter()
    (answer,) = await kubelet.allocate(GPU, [[ids[0]]])
    allocate_s = time.perf_counter() - started
    assert sorted(await big) == ids
    assert answer.envs
    assert allocate_s < 1.0


async def test_more_container_requests_than_a_pod_sends_are_refused_before_any_work(
    launcher: AgentLauncher, kubelet: KubeletStandin
) -> None:
    running = await launcher.start("t4")
    await running.registered(kubelet)
    (device,) = kubelet.devices(GPU)
    stub = kubelet.plugin_stub(GPU)
    many = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])]
        * (MAX_CONTAINER_REQUESTS + 1)
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Allocate(many)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_CONTAINER_REQUESTS}" in (err.value.details() or "")
    (ok,) = await kubelet.allocate(GPU, [[device]])
    assert ok.envs


_ids = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["GPU-0", "", "::", "GPU-x::0", "\x00", "a" * 5000]),
)
_prefer = st.builds(
    pb.ContainerPreferredAllocationRequest,
    available_deviceIDs=st.lists(_ids, max_size=8),
    must_include_deviceIDs=st.lists(_ids, max_size=8),
    allocation_size=st.integers(-(2**31), 2**31 - 1),
)
_alloc = st.builds(pb.ContainerAllocateRequest, devices_ids=st.lists(_ids, max_size=8))


async def test_random_requests_answer_or_say_invalid_and_the_agent_keeps_serving(
    launcher: AgentLauncher, kubelet: KubeletStandin
) -> None:
    running = await launcher.start("t4x4")
    await running.registered(kubelet)
    stub = kubelet.plugin_stub(GPU)
    real = sorted(kubelet.devices(GPU))
    codes: set[grpc.StatusCode] = set()
    rss = rss_bytes()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        prefer=st.lists(_prefer, max_size=3),
        alloc=st.lists(_alloc, max_size=3),
        mix=st.lists(st.sampled_from(real), max_size=4),
    )
    def one(
        prefer: list[pb.ContainerPreferredAllocationRequest],
        alloc: list[pb.ContainerAllocateRequest],
        mix: list[str],
    ) -> None:
        alloc.append(pb.ContainerAllocateRequest(devices_ids=mix))
        codes.update(asyncio.run_coroutine_threadsafe(_both(stub, prefer, alloc), loop).result(10))

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(one)
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
    assert grpc.StatusCode.INVALID_ARGUMENT in codes
    await answers_allocate(kubelet)
    assert not running.task.done()
    assert rss_bytes() - rss < RSS_GROWTH_LIMIT


async def _both(
    stub: Any,
    prefer: list[pb.ContainerPreferredAllocationRequest],
    alloc: list[pb.ContainerAllocateRequest],
) -> list[grpc.StatusCode]:
    """The status of one GetPreferredAllocation and one Allocate."""
    out = []
    for call in (
        lambda: stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(container_requests=prefer)
        ),
        lambda: stub.Allocate(pb.AllocateRequest(container_requests=alloc)),
    ):
        try:
            await call()
            out.append(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as exc:
            out.append(exc.code())
    return out


def _device(i: int, numa: int | None, name: str) -> AdvertisedDevice:
    return AdvertisedDevice(
        id=name, physical_id="GPU-a", gpu_uuid="GPU-a", index=str(i), paths=(),
        numa_node=numa, memory_mib=1,
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), st.text(max_size=300)),
        max_size=20,
    ),
    st.booleans(),
)
def test_the_size_bound_is_the_serialized_size_of_the_unhealthy_list(
    devices: list[tuple[int | None, str]], healthy: bool
) -> None:
    devs = [_device(i, numa, name) for i, (numa, name) in enumerate(devices)]
    unhealthy = device_list((d, False) for d in devs).ByteSize()
    assert list_and_watch_bytes(devs) == unhealthy
    assert device_list((d, healthy) for d in devs).ByteSize() <= unhealthy


def ten_mig_gpus(tmp_path: Path) -> str:
    """Ten A100s, seven 1g.5gb MIG devices each: 70 devices under the single strategy."""
    migs = "".join(f"      - {{profile: 1g.5gb, gi: {gi}}}\n" for gi in range(7, 14))
    gpus = "".join(
        f'  - model: a100-40gb\n    pci_bus_id: "00000000:{i + 16:02x}:00.0"\n'
        f"    numa_node: {i // 5}\n    mig_enabled: true\n    mig_devices:\n{migs}"
        for i in range(10)
    )
    path = tmp_path / "node.yaml"
    path.write_text(f"name: ten-a100\ngpus:\n{gpus}")
    return str(path)


async def test_a_config_the_kubelet_could_not_receive_is_refused_naming_the_limit(
    launcher: AgentLauncher, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    path = config(tmp_path, 2)
    running = await launcher.start(ten_mig_gpus(tmp_path), config=path)
    await kubelet.wait_for(lambda k: KubeletStandin.serves(k, {GPU: 140}), 20)
    path.write_text(config(tmp_path, REPLICAS).read_text())  # 71,680 replicas
    assert not await running.reload()
    rejected = running.rejected or ""
    assert "\n" not in rejected
    assert "over the kubelet's 4 MiB gRPC receive limit (4194304 bytes)" in rejected
    assert "nvidia.com/gpu: 71680 devices" in rejected
    await answers_allocate(kubelet)
    assert len(kubelet.devices(GPU)) == 140
