"""Pod cgroups found in a directory tree of the host's shape, under both cgroup drivers,
and the cgroup facts that decide how memory limits are enforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.adapters.cgroup_tree import PodCgroupTree
from gpuslice.testing.cgroups import CGROUPFS, SYSTEMD, CgroupTree

UID = "0b9f1c1e-6f0a-4d5e-9a3b-2c1d0e9f8a7b"
OTHER = "11111111-2222-3333-4444-555555555555"


@pytest.mark.parametrize("driver", [SYSTEMD, CGROUPFS])
@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
def test_every_pod_cgroup_is_found_with_the_path_the_host_names_it(
    tmp_path: Path, driver: str, qos: str
) -> None:
    tree = CgroupTree(tmp_path, driver)
    tree.create_pod(UID, qos)
    (tmp_path / ("kubepods.slice" if driver == SYSTEMD else "kubepods") / "user.slice").mkdir()
    pods = PodCgroupTree(tmp_path).pods()
    relative = tree.pod_dir(UID, qos).relative_to(tmp_path)
    assert pods == {UID: f"/sys/fs/cgroup/{relative}"}
    tree.remove_pod(UID, qos)
    assert PodCgroupTree(tmp_path).pods() == {}


def test_a_slice_named_like_a_pod_outside_the_kubelets_hierarchy_is_no_pod(
    tmp_path: Path,
) -> None:
    (tmp_path / "kubepods.slice" / f"x-pod{OTHER.replace('-', '_')}.slice").mkdir(parents=True)
    (tmp_path / "system.slice" / f"pod{OTHER}").mkdir(parents=True)
    assert PodCgroupTree(tmp_path).pods() == {}


def test_facts_read_cgroup_v2_and_the_dmem_devices(tmp_path: Path) -> None:
    CgroupTree(tmp_path).make_root(["00000000:3B:00.0"])
    facts = PodCgroupTree(tmp_path).facts("")
    assert facts.cgroup_v2
    assert facts.dmem_controller
    assert facts.dmem_devices == frozenset({"0000:3b:00.0"})
    bare = PodCgroupTree(tmp_path / "missing").facts("old driver")
    assert not bare.cgroup_v2
    assert bare.driver == "old driver"
