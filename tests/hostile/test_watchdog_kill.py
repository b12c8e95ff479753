"""The watchdog's kill signals only the process the sample saw, still in the container over
budget: real child processes stand for the workload, and a proc tree in a temp folder (as
--proc-root) stands for their cgroup and stat files. Each race between the sample and the
kill (the PID reused, the process moved to another cgroup, the process gone) ends with
nothing signalled; a cgroup named like a pod outside the kubelet's hierarchy is no pod."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.adapters.cgroups import CgroupOwners
from gpuslice.core.attribution import Attribution, ContainerUsage
from gpuslice.core.devices import Gpu, HardwareSnapshot
from gpuslice.core.metrics import NoMetrics
from gpuslice.core.usage import ProcessOwner
from gpuslice.core.watchdog import NotProvenError, Policy
from gpuslice.services.watchdog import Watchdog

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
OTHER = "11111111-2222-3333-4444-555555555555"
CID = "ab" * 32
IN_POD = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)


def stat(start: int) -> str:
    # comm may hold spaces and parentheses; the start time is field 22
    return f"123 (evil) name) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n"


def place(proc: Path, pid: int, cgroup: str, start: int = 1000) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "stat").write_text(stat(start))


def sampled(proc: Path, pid: int, cgroup: str = IN_POD) -> CgroupOwners:
    """Owners that sampled `pid` in `cgroup` (start time 1000)."""
    place(proc, pid, cgroup)
    owners = CgroupOwners(proc)
    owners.owners([pid])
    return owners


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_a_process_proven_in_the_container_is_killed(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    place(tmp_path, child.pid, IN_POD)
    owners = CgroupOwners(tmp_path)
    assert owners.owners([child.pid]) == {child.pid: ProcessOwner(UID, CID)}
    owners.kill(child.pid)
    assert child.wait(10) == -9


RACES = {
    # the process sampled ended and another one now has its PID (another start time)
    "pid-reused": (IN_POD, 2000, ProcessLookupError),
    "moved-to-another-pod": (
        IN_POD.replace(UID.replace("-", "_"), OTHER.replace("-", "_")),
        1000,
        NotProvenError,
    ),
    "moved-out-of-pods": ("0::/system.slice/sshd.service\n", 1000, NotProvenError),
}


@pytest.mark.parametrize("race", RACES)
def test_a_change_between_the_sample_and_the_kill_means_no_signal(
    tmp_path: Path, child: subprocess.Popen[bytes], race: str
) -> None:
    cgroup, start, raised = RACES[race]
    owners = sampled(tmp_path, child.pid)
    place(tmp_path, child.pid, cgroup, start=start)
    with pytest.raises(raised):
        owners.kill(child.pid)
    assert alive(child)


def test_a_process_gone_since_the_sample_is_not_signalled_by_its_stale_pid(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    owners = sampled(tmp_path, child.pid)
    child.kill()
    child.wait()
    with pytest.raises(ProcessLookupError):
        owners.kill(child.pid)


@pytest.mark.parametrize(
    "cgroup",
    [
        f"0::/user.slice/user-1000.slice/x-pod{UID.replace('-', '_')}.slice/app.scope\n",
        f"0::/user.slice/user-1000.slice/user@1000.service/kubepods-pod{UID.replace('-', '_')}"
        f".slice/cri-containerd-{CID}.scope\n",
        f"0::/user.slice/pod{UID}/{CID}\n",
        f"0::/user.slice/burstable/pod{UID}/{CID}\n",
        f"12:memory:/kubepods/pod{UID}/{CID}\n11:pids:/kubepods/pod{OTHER}/{CID}\n",
    ],
    ids=["user-slice", "delegated-kubepods-name", "cgroupfs-outside", "qos-outside", "v1-split"],
)
def test_a_cgroup_named_like_a_pod_outside_the_kubelets_hierarchy_is_never_killed(
    tmp_path: Path, child: subprocess.Popen[bytes], cgroup: str
) -> None:
    place(tmp_path, child.pid, cgroup)
    owners = CgroupOwners(tmp_path)
    assert owners.owners([child.pid]) == {}
    with pytest.raises(NotProvenError, match="not seen in a pod"):
        owners.kill(child.pid)
    assert alive(child)


def _usage(pid: int) -> ContainerUsage:
    return ContainerUsage(
        gpu_index=0, gpu_uuid="GPU-a", model_name="T4", namespace="ml", pod="p", container="c",
        resource="r", device_ids=("GPU-a::0",), memory_used_bytes=8 << 30,
        memory_peak_bytes=8 << 30, allocated_share=0.25, used_share=0.5, utilisation=None,
        utilisation_absent="", processes=1, pod_uid=UID, pids=(pid,),
    )  # fmt: skip


async def test_the_watchdog_counts_a_refused_kill_and_keeps_going(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    gpu = Gpu(index=0, minor=0, uuid="GPU-a", name="T4", memory_mib=16384,
              compute_capability=(7, 5))  # fmt: skip
    owners = sampled(tmp_path, child.pid)
    place(tmp_path, child.pid, "0::/system.slice/sshd.service\n")
    outcomes: list[str] = []

    class Counting(NoMetrics):
        def budget_action(self, gpu: object, resource: str, policy: str, outcome: str) -> None:
            outcomes.append(outcome)

    async def kill(pid: int) -> None:
        owners.kill(pid)

    dog = Watchdog(
        Policy.TERMINATE, {}, lambda: HardwareSnapshot(gpus=(gpu,)),
        hold=lambda _: None, kill=kill, events=None, metrics=Counting(),
    )  # fmt: skip
    await dog.check(Attribution(containers=(_usage(child.pid),)))
    assert outcomes == ["refused"]
    assert alive(child)
