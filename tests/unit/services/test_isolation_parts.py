"""The parts memory isolation changes around it: accounting reads exact per-pod memory from
the limit, the watchdog stands down where the driver enforces, /metrics shows each GPU's
mode and the limits in force, and the simulated driver's events file makes a process
allocate (refused past its pod's hard limit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.events import parse_event
from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.adapters.metrics import IsolationCollector, PrometheusMetrics
from gpuslice.core.attribution import Attribution, ContainerUsage, GpuUsage, with_cgroup_usage
from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.errors import BackendError
from gpuslice.core.isolation import DMEM, LABEL, GpuIsolation, IsolationView, Limit, PodLimit
from gpuslice.core.metrics import NoMetrics
from gpuslice.core.sharing import ResourceSettings
from gpuslice.core.watchdog import Policy
from gpuslice.services.labeller import snapshot_labels
from gpuslice.services.watchdog import Watchdog
from gpuslice.testing.cgroups import r615_node

MIB = 1 << 20
GPU = Gpu(0, "GPU-0", "Tesla T4", 0, 16384, (7, 5))
UID = "0b9f1c1e-6f0a-4d5e-9a3b-2c1d0e9f8a7b"


def usage(pod_uid: str = UID, container: str = "main", used: int = 100 * MIB) -> ContainerUsage:
    return ContainerUsage(
        0, "GPU-0", "Tesla T4", "ns", "p", container, "nvidia.com/gpu", ("GPU-0::0",),
        used, used, 0.25, used / (16384 * MIB), None, "", 1, pod_uid=pod_uid,
    )  # fmt: skip


def result(*containers: ContainerUsage) -> Attribution:
    gpu = GpuUsage(0, "GPU-0", "Tesla T4", 16384 * MIB, 0, None, "", 0)
    return Attribution(containers=containers, gpus=(gpu,))


def test_the_limits_current_used_replaces_the_process_sum_of_a_pods_one_container() -> None:
    got = with_cgroup_usage(result(usage()), {(UID, "GPU-0"): 4096 * MIB})
    (c,) = got.containers
    assert (c.memory_used_bytes, c.memory_source, c.used_share) == (4096 * MIB, "cgroup", 0.25)
    two = with_cgroup_usage(result(usage(), usage(container="side")), {(UID, "GPU-0"): 4096 * MIB})
    assert {c.memory_used_bytes for c in two.containers} == {100 * MIB}  # cannot be split


async def test_the_watchdog_has_nothing_to_act_on_where_the_driver_enforces() -> None:
    held: list[frozenset[str]] = []
    enforced: frozenset[str] = frozenset()

    async def kill(pid: int) -> None:
        raise AssertionError("the unhealthy policy kills nothing")

    dog = Watchdog(
        Policy.UNHEALTHY, {}, lambda: HardwareSnapshot((GPU,)), hold=held.append,
        kill=kill, events=None, metrics=NoMetrics(), enforced=lambda: enforced,
    )  # fmt: skip
    over = result(usage(used=8000 * MIB))
    await dog.check(over)
    assert dog.actions == 1  # no enforcement: the budget is the only guard
    enforced = frozenset({"GPU-0"})
    await dog.check(over)
    assert (dog.actions, dog.latest, dog.stood_down) == (1, [], enforced)


def test_metrics_show_each_gpus_mode_and_the_limits_in_force() -> None:
    metrics = PrometheusMetrics(hostname="n")
    view = IsolationView(
        ((GpuIsolation(0, "GPU-0", DMEM), "Tesla T4"),),
        (PodLimit(UID, "GPU-0", Limit(4 << 30, 1 << 30)),),
    )
    metrics.add(IsolationCollector(lambda: view, hostname="n"))
    _, page = metrics.page()
    samples = {
        (s.name, s.labels.get("mode", s.labels.get("kind", ""))): s.value
        for f in text_string_to_metric_families(page.decode())
        for s in f.samples
        if "isolation" in s.name or "limit" in s.name
    }
    assert samples == {
        ("gpuslice_gpu_memory_isolation_info", DMEM): 1,
        ("gpuslice_pod_gpu_memory_limit_bytes", "hard"): 4 << 30,
        ("gpuslice_pod_gpu_memory_limit_bytes", "soft"): 1 << 30,
    }


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ({"allocate": {"pid": 1}}, '"memory_mib" must be an integer >= 1'),
        ({"allocate": {"pid": 1, "memory_mib": 5, "gpu": 0}}, "unknown key 'gpu'"),
        ({"allocate": {"pid": 1, "memory_mib": 5}, "gpu": 0}, "no other key"),
        ({"allocate": 7}, "must be an object"),
    ],
)
def test_a_bad_allocate_line_is_refused_in_one_line(line: object, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_event(json.dumps(line).encode(), load_spec("t4"))


def test_the_simulated_driver_refuses_growth_past_a_pods_hard_limit(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    backend = FakeBackend(load_spec(r615_node("t4", tmp_path / "node.yaml")), events)
    gpu = backend.snapshot().gpus[0].uuid
    pod = f"/sys/fs/cgroup/kubepods/burstable/pod{UID}"
    backend.set_memory_limit(gpu, pod, Limit(1000 * MIB))
    lines = [
        {"process": {"pid": 5, "gpu": 0, "memory_mib": 600, "pod_uid": UID}},
        {"process": {"pid": 6, "gpu": 0, "memory_mib": 300, "pod_uid": UID}},
        {"allocate": {"pid": 6, "memory_mib": 200}},  # 1100 MiB in the pod: refused
        {"allocate": {"pid": 6, "memory_mib": 100}},  # 1000 MiB: at the limit, allowed
        {"process": {"pid": 7, "gpu": 0, "memory_mib": 5000}},  # in no pod: unbounded
    ]
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert len(backend.refused) == 1
    assert backend.memory_limit(gpu, pod).used == 1000 * MIB
    backend.clear_memory_limit(gpu, pod)
    assert not backend.memory_limit(gpu, pod).limited
    backend.close()


async def test_the_node_label_joins_the_labellers_labels() -> None:
    async def read() -> tuple[HardwareSnapshot, ResourceSettings]:
        return load_spec("t4"), ResourceSettings()

    labels = await snapshot_labels(read, more=lambda: {LABEL: DMEM})()
    assert labels[LABEL] == DMEM
    assert labels["nvidia.com/gpu.count"] == "1"
    assert LABEL not in await snapshot_labels(read)()


def test_a_driver_before_r615_cannot_set_a_limit(tmp_path: Path) -> None:
    backend = FakeBackend(load_spec("t4"))  # the built-in profile's driver: 535
    gpu = backend.snapshot().gpus[0].uuid
    assert backend.limit_problem() == "driver 535.183.01 is older than r615"
    with pytest.raises(BackendError, match="older than r615"):
        backend.set_memory_limit(gpu, f"/sys/fs/cgroup/kubepods/pod{UID}", Limit(MIB))
