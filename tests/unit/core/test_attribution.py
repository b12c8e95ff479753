"""The accounting join, table-driven: allocations x process samples x process owners.

Each case names what it proves; the node is one time-sliced GPU (4 replicas), one
whole GPU, and one MIG GPU (a 3g.20gb and a 1g.5gb device).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from gpuslice.core.attribution import (
    NO_DEVICE,
    NO_POD,
    Attribution,
    attribute,
    with_pod_uids,
)
from gpuslice.core.devices import Gpu, HardwareSnapshot, MigDevice
from gpuslice.core.usage import (
    CheckpointEntry,
    ContainerDevices,
    DeviceProcesses,
    GpuSample,
    ProcessOwner,
    ProcessSample,
    ProcessUse,
)

MIB = 1024 * 1024
TS, WHOLE, MIGGPU = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"
BIG, SMALL = "MIG-big", "MIG-small"
NAME = "NVIDIA A100-SXM4-40GB"
NODE = HardwareSnapshot(
    (
        Gpu(0, TS, NAME, 0, 40960, (8, 0)),
        Gpu(1, WHOLE, NAME, 1, 40960, (8, 0)),
        Gpu(
            2,
            MIGGPU,
            NAME,
            2,
            40960,
            (8, 0),
            mig_capable=True,
            mig_enabled=True,
            mig_devices=(
                MigDevice(BIG, 0, "3g.20gb", 2, 0, 20480),
                MigDevice(SMALL, 1, "1g.5gb", 9, 0, 5120),
            ),
        ),
    )
)
REPLICAS = {"nvidia.com/gpu": (*(f"{TS}::{n}" for n in range(4)), WHOLE)}
REPLICAS |= {"nvidia.com/mig-3g.20gb": (BIG,), "nvidia.com/mig-1g.5gb": (SMALL,)}


def alloc(ns: str, pod: str, ctr: str, *ids: str, res: str = "nvidia.com/gpu") -> ContainerDevices:
    return ContainerDevices(ns, pod, ctr, res, ids, pod_uid=f"uid-{pod}")


def proc(pid: int, mib: int, sm: float | None = 0.0) -> ProcessUse:
    return ProcessUse(pid, mib * MIB, sm)


def sample(
    ts: tuple[ProcessUse, ...] = (),
    whole: tuple[ProcessUse, ...] = (),
    big: tuple[ProcessUse, ...] = (),
    small: tuple[ProcessUse, ...] = (),
) -> ProcessSample:
    return ProcessSample(
        (
            GpuSample(TS, (DeviceProcesses(TS, ts),)),
            GpuSample(WHOLE, (DeviceProcesses(WHOLE, whole),)),
            GpuSample(
                MIGGPU,
                (DeviceProcesses(BIG, big, "mig"), DeviceProcesses(SMALL, small, "mig")),
                util_absent="mig",
            ),
        )
    )


def owner(pod: str) -> ProcessOwner:
    return ProcessOwner(f"uid-{pod}")


@dataclass
class Case:
    proves: str
    allocations: list[ContainerDevices]
    sample: ProcessSample
    owners: dict[int, ProcessOwner]
    # (pod/container, gpu index) -> (memory MiB, allocated share, used share, util, absent)
    containers: dict[tuple[str, int], tuple[int, float | None, float, float | None, str]]
    unattributed: dict[tuple[int, str], int] = field(default_factory=dict)  # MiB
    shared: dict[tuple[int, tuple[str, ...]], int] = field(default_factory=dict)  # MiB
    flagged: dict[str, tuple[str, ...]] = field(default_factory=dict)


CASES = [
    Case(
        "each replica holder gets its own processes and a quarter of the GPU",
        [alloc("a", "p1", "c", f"{TS}::0"), alloc("b", "p2", "c", f"{TS}::3")],
        sample(ts=(proc(10, 4096, 0.25), proc(11, 1024, 0.5), proc(12, 2048, 0.1))),
        {10: owner("p1"), 11: owner("p1"), 12: owner("p2")},
        {("p1/c", 0): (5120, 0.25, 0.125, 0.75, ""), ("p2/c", 0): (2048, 0.25, 0.05, 0.1, "")},
    ),
    Case(
        "two replicas of one GPU in one container fold onto the GPU: half of it",
        [alloc("a", "p1", "c", f"{TS}::1", f"{TS}::2")],
        sample(ts=(proc(10, 1024),)),
        {10: owner("p1")},
        {("p1/c", 0): (1024, 0.5, 0.025, 0.0, "")},
    ),
    Case(
        "a container with no process is listed with nothing used",
        [alloc("a", "p1", "c", WHOLE)],
        sample(),
        {},
        {("p1/c", 1): (0, 1.0, 0.0, 0.0, "")},
    ),
    Case(
        "MIG: memory per MIG device, the slice's share of the GPU, no utilisation",
        [
            alloc("a", "p1", "c", BIG, res="nvidia.com/mig-3g.20gb"),
            alloc("a", "p2", "c", SMALL, res="nvidia.com/mig-1g.5gb"),
        ],
        sample(big=(proc(20, 8192, None),), small=(proc(21, 512, None),)),
        {20: owner("p1"), 21: owner("p2")},
        {
            ("p1/c", 2): (8192, 0.5, 0.2, None, "mig"),
            ("p2/c", 2): (512, 0.125, 0.0125, None, "mig"),
        },
    ),
    Case(
        "a process in no pod is unattributed on its GPU, never given to a holder",
        [alloc("a", "p1", "c", WHOLE)],
        sample(whole=(proc(30, 2048), proc(31, 100))),
        {31: owner("p1")},
        {("p1/c", 1): (100, 1.0, 100 / 40960, 0.0, "")},
        unattributed={(1, NO_POD): 2048},
    ),
    Case(
        "a pod using a GPU it holds nothing on is unattributed there",
        [alloc("a", "p1", "c", f"{TS}::0")],
        sample(whole=(proc(40, 1000),), ts=(proc(41, 10),)),
        {40: owner("p1"), 41: owner("sneaky")},
        {("p1/c", 0): (0, 0.25, 0.0, 0.0, "")},
        unattributed={(1, NO_DEVICE): 1000, (0, NO_DEVICE): 10},
    ),
    Case(
        "two containers of one pod on one GPU: their processes are shared, both flagged",
        [alloc("a", "p1", "x", f"{TS}::0"), alloc("a", "p1", "y", f"{TS}::1")],
        sample(ts=(proc(50, 300),)),
        {50: owner("p1")},
        {("p1/x", 0): (0, 0.25, 0.0, 0.0, ""), ("p1/y", 0): (0, 0.25, 0.0, 0.0, "")},
        shared={(0, ("a/p1/x", "a/p1/y")): 300},
        flagged={"p1/x": ("a/p1/y",), "p1/y": ("a/p1/x",)},
    ),
    Case(
        "one replica listed for two containers (an init container's, handed on): flagged",
        [alloc("a", "p1", "init", f"{TS}::0"), alloc("a", "p1", "main", f"{TS}::0")],
        sample(),
        {},
        {("p1/init", 0): (0, 0.25, 0.0, 0.0, ""), ("p1/main", 0): (0, 0.25, 0.0, 0.0, "")},
        flagged={"p1/init": ("a/p1/main",), "p1/main": ("a/p1/init",)},
    ),
    Case(
        "utilisation NVML did not give for one process makes the container's absent",
        [alloc("a", "p1", "c", WHOLE)],
        sample(whole=(proc(60, 1, 0.5), proc(61, 1, None))),
        {60: owner("p1"), 61: owner("p1")},
        {("p1/c", 1): (2, 1.0, 2 / 40960, None, "unreadable")},
    ),
    Case(
        "a replica the kubelet no longer lists has an unknown share, not a guessed one",
        [alloc("a", "p1", "c", f"{TS}::9", res="nvidia.com/gone")],
        sample(),
        {},
        {("p1/c", 0): (0, None, 0.0, 0.0, "")},
    ),
    Case(
        "device IDs of the index strategy name GPUs and MIG devices too",
        [alloc("a", "p1", "c", "1"), alloc("a", "p2", "c", "2:1", res="nvidia.com/mig-1g.5gb")],
        sample(whole=(proc(70, 64),), small=(proc(71, 32, None),)),
        {70: owner("p1"), 71: owner("p2")},
        {
            ("p1/c", 1): (64, 1.0, 64 / 40960, 0.0, ""),
            ("p2/c", 2): (32, 0.125, 32 / 40960, None, "mig"),
        },
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.proves for c in CASES])
def test_attribution(case: Case) -> None:
    got = attribute(NODE, case.sample, case.allocations, REPLICAS, case.owners)
    containers = {
        (f"{c.pod}/{c.container}", c.gpu_index): (
            c.memory_used_bytes // MIB,
            c.allocated_share,
            c.used_share,
            c.utilisation,
            c.utilisation_absent,
        )
        for c in got.containers
    }
    assert rounded(containers) == rounded(case.containers)
    assert {(u.gpu_index, u.reason): u.memory_used_bytes // MIB for u in got.unattributed} == (
        case.unattributed
    )
    assert {(s.gpu_index, s.containers): s.memory_used_bytes // MIB for s in got.shared} == (
        case.shared
    )
    flagged = {f"{c.pod}/{c.container}": c.shared_with for c in got.containers if c.shared_with}
    assert flagged == case.flagged
    assert_memory_conserved(case.sample, got)


def rounded(table: Mapping[tuple[str, int], tuple[object, ...]]) -> dict[object, object]:
    return {
        k: tuple(round(x, 9) if isinstance(x, float) else x for x in v) for k, v in table.items()
    }


def assert_memory_conserved(sample: ProcessSample, got: Attribution) -> None:
    """Every process's memory is in exactly one series: sum() over them is the GPU's."""
    for gpu in got.gpus:
        total = sum(
            [c.memory_used_bytes for c in got.containers if c.gpu_uuid == gpu.gpu_uuid]
            + [s.memory_used_bytes for s in got.shared if s.gpu_uuid == gpu.gpu_uuid]
            + [u.memory_used_bytes for u in got.unattributed if u.gpu_uuid == gpu.gpu_uuid]
        )
        assert total == gpu.memory_used_bytes


def test_labels_of_a_series_name_the_gpu_like_dcgm_exporter() -> None:
    got = attribute(NODE, sample(), [alloc("a", "p1", "c", f"{TS}::2")], REPLICAS, {})
    (c,) = got.containers
    assert (c.gpu_index, c.gpu_uuid, c.model_name) == (0, TS, NAME)
    assert (c.namespace, c.pod, c.container, c.resource) == ("a", "p1", "c", "nvidia.com/gpu")
    assert c.device_ids == (f"{TS}::2",)
    gpu = got.gpus[2]
    assert (gpu.memory_total_bytes, gpu.utilisation, gpu.utilisation_absent) == (
        40960 * MIB,
        None,
        "mig",
    )


def test_the_peak_is_the_most_over_samples_of_a_live_container() -> None:
    allocations = [alloc("a", "p1", "c", WHOLE)]
    first = attribute(NODE, sample(whole=(proc(1, 900),)), allocations, REPLICAS, {1: owner("p1")})
    second = attribute(
        NODE, sample(whole=(proc(1, 300),)), allocations, REPLICAS, {1: owner("p1")}, first.peaks()
    )
    (c,) = second.containers
    assert (c.memory_used_bytes, c.memory_peak_bytes) == (300 * MIB, 900 * MIB)
    gone = attribute(NODE, sample(), [], REPLICAS, {}, second.peaks())
    assert gone.peaks() == {}


def test_pod_uids_join_the_checkpoint_on_container_resource_and_device_ids() -> None:
    listed = [
        ContainerDevices("a", "p1", "c", "nvidia.com/gpu", (f"{TS}::0", f"{TS}::1")),
        ContainerDevices("b", "p2", "c", "nvidia.com/gpu", (f"{TS}::2",)),
    ]
    entries = [CheckpointEntry("u1", "c", "nvidia.com/gpu", (f"{TS}::1", f"{TS}::0"))]
    assert [a.pod_uid for a in with_pod_uids(listed, entries)] == ["u1", ""]


def test_a_gpu_that_could_not_be_read_carries_its_error() -> None:
    broken = ProcessSample((GpuSample(WHOLE, error="GPU 1: Unknown Error"),))
    got = attribute(NODE, broken, [alloc("a", "p1", "c", WHOLE)], REPLICAS, {})
    (gpu,) = got.gpus
    assert (gpu.gpu_index, gpu.error, gpu.processes) == (1, "GPU 1: Unknown Error", 0)
    (holder,) = got.containers
    assert (holder.utilisation, holder.utilisation_absent) == (None, "unreadable")
