"""Pod cgroups found in a directory tree of the host's shape, under both cgroup drivers,
and the cgroup facts that decide how memory limits are enforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuslice.adapters.cgroup_tree import MAX_DEPTH, PodCgroupTree
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


# The kubelet's --cgroup-root: kind's "/kubelet", and a deeper custom one.
KUBEPODS = {
    (SYSTEMD, "/kubelet"): "kubelet.slice/kubelet-kubepods.slice",
    (CGROUPFS, "/kubelet"): "kubelet/kubepods",
    (SYSTEMD, "/k8s/node-a"): "k8s.slice/k8s-node_a.slice/k8s-node_a-kubepods.slice",
    (CGROUPFS, "/k8s/node-a"): "k8s/node-a/kubepods",
}


@pytest.mark.parametrize(("driver", "cgroup_root"), list(KUBEPODS), ids=str)
@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
def test_pods_are_found_below_a_kubelets_custom_cgroup_root(
    tmp_path: Path, driver: str, cgroup_root: str, qos: str
) -> None:
    tree = CgroupTree(tmp_path, driver, cgroup_root)
    assert tree.make_kubepods() == tmp_path / KUBEPODS[driver, cgroup_root]
    (tmp_path / "system.slice" / "containerd.service").mkdir(parents=True)
    tree.create_pod(UID, qos)
    found = PodCgroupTree(tmp_path)
    relative = tree.pod_dir(UID, qos).relative_to(tmp_path)
    assert found.pods() == {UID: f"/sys/fs/cgroup/{relative}"}
    assert found.kubepods() == (f"/sys/fs/cgroup/{KUBEPODS[driver, cgroup_root]}",)
    assert found.missing() == ""
    assert str(tmp_path / KUBEPODS[driver, cgroup_root]) in found.watched()
    tree.remove_pod(UID, qos)
    assert found.pods() == {}


def test_kinds_pod_slices_are_found_and_a_foreign_prefix_is_not(tmp_path: Path) -> None:
    """kind's layout as a kubelet with --cgroup-root=/kubelet and the systemd driver makes
    it; a pod slice whose prefix is not its parent's is not the kubelet's."""
    CgroupTree(tmp_path, SYSTEMD, "/kubelet").create_pod(UID, "besteffort")
    level = tmp_path / "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice"
    assert (level / f"kubelet-kubepods-besteffort-pod{UID.replace('-', '_')}.slice").is_dir()
    (level / f"other-kubepods-besteffort-pod{OTHER.replace('-', '_')}.slice").mkdir()
    assert PodCgroupTree(tmp_path).pods() == {UID: f"/sys/fs/cgroup/{level.relative_to(tmp_path)}/"
        f"kubelet-kubepods-besteffort-pod{UID.replace('-', '_')}.slice"}  # fmt: skip


def test_the_shallowest_kubepods_is_the_nodes_own(tmp_path: Path) -> None:
    """A kind node's tree seen from its host: the host kubelet's kubepods is at the root,
    the nested node's is deeper and not this kubelet's."""
    CgroupTree(tmp_path, SYSTEMD).create_pod(UID)
    CgroupTree(tmp_path / "system.slice" / "docker-1.scope", SYSTEMD, "/kubelet").create_pod(OTHER)
    found = PodCgroupTree(tmp_path)
    assert list(found.pods()) == [UID]
    assert found.kubepods() == ("/sys/fs/cgroup/kubepods.slice",)


def test_without_a_kubepods_cgroup_the_search_says_what_it_searched(tmp_path: Path) -> None:
    CgroupTree(tmp_path).make_root()
    (tmp_path / "system.slice" / "containerd.service").mkdir(parents=True)
    found = PodCgroupTree(tmp_path)
    assert found.pods() == {}
    assert found.kubepods() == ()
    line = found.missing()
    assert (
        f"no kubepods cgroup (kubepods, kubepods.slice or <prefix>-kubepods.slice) under {tmp_path}"
        in line
    )
    assert "without following links" in line
    assert "\n" not in line
    # A default kubelet that starts later is followed where it makes its cgroups.
    assert str(tmp_path / "kubepods.slice" / "kubepods-burstable.slice") in found.watched()
    CgroupTree(tmp_path, CGROUPFS, "/kubelet").create_pod(UID)  # found on the next pass
    assert list(found.pods()) == [UID]
    assert found.missing() == ""
    absent = PodCgroupTree(tmp_path / "absent")
    assert absent.pods() == {}
    assert f"the cgroup tree at {tmp_path / 'absent'} cannot be read" in absent.missing()


def test_the_search_follows_no_link_and_stops_at_its_depth(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    CgroupTree(elsewhere, CGROUPFS).create_pod(UID)
    root = tmp_path / "root"
    root.mkdir()
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    deep = root.joinpath(*[f"d{i}" for i in range(MAX_DEPTH)])
    CgroupTree(deep, CGROUPFS).create_pod(OTHER)  # kubepods one level too deep
    found = PodCgroupTree(root)
    assert found.pods() == {}
    assert f"searched {MAX_DEPTH} levels deep" in found.missing()
    shallower = PodCgroupTree(root / "d0")
    assert list(shallower.pods()) == [OTHER]


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
