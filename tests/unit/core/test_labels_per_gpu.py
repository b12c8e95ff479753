"""Labels of a node with per-GPU sharing (core.label_shares): the nvidia.com/gpu group
describes the GPUs still served as nvidia.com/gpu, each renamed resource serving part
of them gets its own group, and configs without device selection keep GFD's labels."""

from __future__ import annotations

from gpuslice.core.labels import label_node, node_labels
from gpuslice.core.sharing import GPU_RESOURCE, MIG_MIXED, MIG_NONE, ReplicaRule

from . import builders as b

SHARED = "nvidia.com/gpu.shared"
T4 = "Tesla T4"


def group(labels: dict[str, str], name: str) -> dict[str, str]:
    keys = ("count", "replicas", "sharing-strategy", "product", "memory")
    return {k: labels[f"{name}.{k}"] for k in keys if f"{name}.{k}" in labels}


def test_whole_gpus_and_a_renamed_shared_part_each_get_their_group() -> None:
    rule = ReplicaRule(GPU_RESOURCE, 4, SHARED, ("2", "3", "4", "5", "6", "7"))
    got = node_labels(b.snapshot(*b.gpus(8)), b.settings(MIG_NONE, rule))
    gpu = group(got, GPU_RESOURCE)
    assert (gpu["count"], gpu["replicas"], gpu["sharing-strategy"]) == ("8", "1", "none")
    assert gpu["product"] == "NVIDIA-A100-SXM4-40GB"
    assert group(got, SHARED) == {
        "count": "6",
        "replicas": "4",
        "sharing-strategy": "time-slicing",
        "product": "NVIDIA-A100-SXM4-40GB",
        "memory": "40960",
    }


def test_a_subset_shared_under_its_own_name_labels_the_largest_replicas() -> None:
    """One resource, GPU 0 whole and GPU 1 in 4: gpu.replicas is 4, with the suffix."""
    rule = ReplicaRule(GPU_RESOURCE, 4, devices=("1",))
    got = node_labels(b.snapshot(*b.gpus(2)), b.settings(MIG_NONE, rule))
    gpu = group(got, GPU_RESOURCE)
    assert (gpu["replicas"], gpu["product"]) == ("4", "NVIDIA-A100-SXM4-40GB-SHARED")
    assert not any(k.startswith(SHARED) for k in got)


def test_per_model_names_label_each_model() -> None:
    """Two models on one node, each renamed: each group names its own product."""
    gpus = (b.gpu(0), b.gpu(1, name=T4, memory_mib=15360))
    rules = (
        ReplicaRule(GPU_RESOURCE, 2, "nvidia.com/gpu-a100", ("0",), "r[0]"),
        ReplicaRule(GPU_RESOURCE, 8, "nvidia.com/gpu-t4", ("1",), "r[1]"),
    )
    got = label_node(b.snapshot(*gpus), b.settings(MIG_NONE, *rules)).labels
    assert group(got, "nvidia.com/gpu-t4")["product"] == "Tesla-T4"
    assert group(got, "nvidia.com/gpu-t4")["memory"] == "15360"
    assert group(got, "nvidia.com/gpu-a100")["replicas"] == "2"
    # No GPU stays nvidia.com/gpu: the group describes the lowest index's resource.
    assert group(got, GPU_RESOURCE)["replicas"] == "2"


def test_a_renamed_mig_profile_subset_gets_a_mig_product() -> None:
    rule = ReplicaRule("nvidia.com/mig-1g.5gb", 2, "nvidia.com/mig-small", ("0:0",))
    gpu = b.gpu(0, profiles=["1g.5gb", "1g.5gb"])
    got = node_labels(b.snapshot(gpu), b.settings(MIG_MIXED, rule))
    assert group(got, "nvidia.com/mig-small")["product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert group(got, "nvidia.com/mig-1g.5gb")["replicas"] == "1"


def test_without_device_selection_the_labels_are_gfds() -> None:
    """renameByDefault-style configs label as GFD does: no group for the renamed name."""
    classic = ReplicaRule(GPU_RESOURCE, 4, SHARED)
    every = ReplicaRule(GPU_RESOURCE, 4, SHARED, 8)  # a count covering every GPU
    gfd = node_labels(b.snapshot(*b.gpus(2)), b.settings(MIG_NONE, classic))
    assert group(gfd, GPU_RESOURCE)["replicas"] == "4"
    assert not any(k.startswith(SHARED) for k in gfd)
    assert node_labels(b.snapshot(*b.gpus(2)), b.settings(MIG_NONE, every)) == gfd
