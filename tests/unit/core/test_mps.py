"""core.mps: a daemon per MPS resource with upstream's limits, and the client cap."""

from __future__ import annotations

import dataclasses

import pytest

from gpuslice.core.errors import HardwareError
from gpuslice.core.mps import (
    DaemonPlan,
    RunningDaemon,
    keeps,
    max_clients,
    pids,
    plan_daemons,
    server_commands,
)
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import MIG_NONE, MPS, ReplicaRule

from . import builders as b


def plans(
    replicas: int, *gpus: object, pinned: int = 0, root: str = "/run/nvidia/mps"
) -> tuple[DaemonPlan, ...]:
    snapshot = b.snapshot(*gpus)  # type: ignore[arg-type]
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=replicas)
    resources = build_resources(snapshot, b.settings(MIG_NONE, rule, strategy=MPS))
    return plan_daemons(resources, snapshot.gpus, root, pinned_limit_mib=pinned)


def test_one_daemon_per_resource_with_memory_and_threads_split_by_replicas() -> None:
    (plan,) = plans(4, b.gpu(0), b.gpu(1, memory_mib=81920))
    assert plan.root == "/run/nvidia/mps/nvidia.com/gpu"
    assert plan.pipe_dir == "/run/nvidia/mps/nvidia.com/gpu/pipe"
    assert plan.gpu_uuids == (b.gpu_uuid(0), b.gpu_uuid(1))
    assert plan.pinned_mib == (10240, 20480)
    assert plan.thread_percentage == 25
    assert plan.env["CUDA_VISIBLE_DEVICES"] == f"{b.gpu_uuid(0)},{b.gpu_uuid(1)}"
    assert plan.set_commands() == [
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_device_pinned_mem_limit 1 20480M",
        "set_default_active_thread_percentage 25",
    ]


def test_a_size_the_user_gives_replaces_memory_over_replicas() -> None:
    (plan,) = plans(4, b.gpu(0), pinned=2048)
    assert plan.pinned_mib == (2048,)


def test_thread_percentage_rounds_down_as_upstream() -> None:
    (plan,) = plans(3, b.gpu(0))
    assert plan.thread_percentage == 33


def test_no_daemon_without_mps_or_root() -> None:
    assert plans(4, b.gpu(0), root="") == ()
    snapshot = b.snapshot(b.gpu(0))
    rule = ReplicaRule(name="nvidia.com/gpu", replicas=4)
    shared = build_resources(snapshot, b.settings(MIG_NONE, rule))  # time-slicing
    assert plan_daemons(shared, snapshot.gpus, "/run/nvidia/mps") == ()


@pytest.mark.parametrize(
    ("capability", "cap"), [((7, 5), 48), ((9, 0), 48), ((7, 0), 16), ((6, 1), 16)]
)
def test_client_cap_by_compute_capability(capability: tuple[int, int], cap: int) -> None:
    assert max_clients(capability) == cap
    gpu = dataclasses.replace(b.gpu(0), compute_capability=capability)
    assert plans(cap, gpu)
    with pytest.raises(HardwareError) as refused:
        plans(cap + 1, gpu)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"sharing.mps: nvidia.com/gpu has {cap + 1} replicas of GPU 0 ")
    assert message.endswith(f"MPS allows at most {cap} clients per GPU")


@pytest.mark.parametrize(
    ("pinned", "threads", "wrong"),
    [
        (["10240M"], "25.0", 0),
        (["10G"], "25", 0),
        (["10240"], "25.0", 0),
        (["5120M"], "25.0", 1),
        (["10240M"], "100.0", 1),
        (["garbage"], "", 2),
    ],
)
def test_mismatches_read_the_daemons_answers(pinned: list[str], threads: str, wrong: int) -> None:
    (plan,) = plans(4, b.gpu(0))
    assert len(plan.mismatches(pinned, threads)) == wrong


PLAN = DaemonPlan("nvidia.com/gpu", "/mps/nvidia.com/gpu", ("GPU-a", "GPU-b"), (100, 200), 25)


@pytest.mark.parametrize(
    ("running", "kept"),
    [
        (RunningDaemon(PLAN.root, 7, ("GPU-a", "GPU-b")), True),
        (RunningDaemon(PLAN.root, 7, ("GPU-a",)), False),  # other GPUs: a new daemon
        (RunningDaemon(PLAN.root, 7, ("GPU-b", "GPU-a")), False),  # other ordinals
        (RunningDaemon(PLAN.root, 7, None), False),  # not started by gpuslice
        (RunningDaemon("/mps/nvidia.com/gpu.shared", 7, ("GPU-a", "GPU-b")), False),
    ],
)
def test_a_running_daemon_keeps_a_plan_only_with_its_gpus(
    running: RunningDaemon, kept: bool
) -> None:
    """Limits never decide it: set_default_* change them on the running daemon."""
    assert keeps(running, PLAN) is kept
    other_limits = dataclasses.replace(PLAN, pinned_mib=(1, 1), thread_percentage=50)
    assert keeps(running, other_limits) is kept


def test_server_commands_give_a_running_server_the_plans_limits() -> None:
    assert server_commands(PLAN, "4242") == [
        "set_device_pinned_mem_limit 4242 0 100M",
        "set_device_pinned_mem_limit 4242 1 200M",
        "set_active_thread_percentage 4242 25",
    ]


def test_pids_read_one_a_line_and_skip_anything_else() -> None:
    assert pids("12\n 34 \n\nServer 5 gone\n") == ("12", "34", "5")
    assert pids("") == ()
