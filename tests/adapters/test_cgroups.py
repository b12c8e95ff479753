"""Process -> pod UID and container ID from real /proc/<pid>/cgroup files in a temp tree:
both cgroup drivers, both cgroup versions, the container runtimes' ID forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.adapters.cgroups import CgroupOwners
from gpuslice.core.usage import ProcessOwner

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
SLICE_UID = UID.replace("-", "_")
CID = "ab" * 32

CASES = [
    ("v1 cgroupfs burstable", f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"),
    ("v1 cgroupfs guaranteed", f"4:cpu,cpuacct:/kubepods/pod{UID}/{CID}\n1:name=systemd:/\n"),
    (
        "v1 systemd containerd",
        "11:devices:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope\n",
    ),
    (
        "v2 systemd cri-o",
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{SLICE_UID}.slice/crio-{CID}.scope\n",
    ),
    (
        "v2 systemd docker",
        f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/docker-{CID}.scope\n",
    ),
    ("v2 cgroupfs", f"0::/kubepods/besteffort/pod{UID}/{CID}\n"),
    (
        "v2 systemd under kind's kubelet.slice",
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope\n",
    ),
    (
        "v2 systemd under --cgroup-root=/k8s, guaranteed",
        f"0::/k8s.slice/k8s-kubepods.slice/k8s-kubepods-pod{SLICE_UID}.slice/crio-{CID}.scope\n",
    ),
    ("v2 cgroupfs under --cgroup-root=/kubelet", f"0::/kubelet/kubepods/pod{UID}/{CID}\n"),
    (
        "v2 seen from another cgroup namespace",
        f"0::/../../kubepods-burstable-pod{SLICE_UID}.slice/cri-containerd-{CID}.scope\n",
    ),
]


def proc_tree(root: Path, files: dict[int, str]) -> Path:
    for pid, text in files.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
        (root / str(pid) / "stat").write_text(f"{pid} (python3) S {' '.join(['0'] * 18)} 4242 0\n")
    return root


@pytest.mark.parametrize(("name", "text"), CASES, ids=[c[0] for c in CASES])
def test_pod_uid_and_container_id_from_each_form(tmp_path: Path, name: str, text: str) -> None:
    owners = CgroupOwners(proc_tree(tmp_path, {42: text}))
    assert owners.owners([42]) == {42: ProcessOwner(UID, CID)}


def test_a_pod_cgroup_without_a_container_leaf_names_the_pod_only(tmp_path: Path) -> None:
    text = f"0::/kubepods.slice/kubepods-pod{SLICE_UID}.slice/crio-conmon-{CID}.scope\n"
    owners = CgroupOwners(proc_tree(tmp_path, {7: text}))
    assert owners.owners([7]) == {7: ProcessOwner(UID, "")}


def test_host_processes_and_gone_pids_are_left_out(tmp_path: Path) -> None:
    owners = CgroupOwners(
        proc_tree(
            tmp_path,
            {
                1: "0::/init.scope\n",
                2: "0::/system.slice/containerd.service\n",
                3: f"0::/kubepods/pod{UID}/{CID}\n",
                # a prefix that is not its parent's: no slice of the kubelet's
                4: f"0::/kubelet.slice/kubelet-kubepods.slice/x-kubepods-pod{SLICE_UID}.slice\n",
            },
        )
    )
    assert owners.owners([1, 2, 3, 4, 999]) == {3: ProcessOwner(UID, CID)}
