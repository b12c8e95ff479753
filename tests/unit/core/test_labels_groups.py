"""Resource label groups: gpu.*, the -SHARED rule, replicas, MIG single and mixed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuslice.core.devices import Gpu, MigDevice, MigEngines
from gpuslice.core.labels import label_node, node_labels
from gpuslice.core.sharing import (
    MIG_MIXED,
    MIG_NONE,
    MIG_SINGLE,
    MPS,
    TIME_SLICING,
    ReplicaRule,
)

from . import builders as b

GPU = "nvidia.com/gpu"
SHARED_GPU = ReplicaRule(GPU, 4)
RENAMED_GPU = ReplicaRule(GPU, 4, rename="nvidia.com/gpu.shared")


def labels(mig_strategy: str, *gpus: Gpu, rules: tuple[ReplicaRule, ...] = ()) -> dict[str, str]:
    return node_labels(b.snapshot(*gpus), b.settings(mig_strategy, *rules))


def group(got: dict[str, str], resource: str) -> dict[str, str]:
    """The labels of one resource group, by suffix ("product", "count", ...)."""
    prefix = resource + "."
    return {k.removeprefix(prefix): v for k, v in got.items() if k.startswith(prefix)}


def base(got: dict[str, str], resource: str = GPU) -> tuple[str, str, str, str]:
    g = group(got, resource)
    return g["product"], g["count"], g["replicas"], g["sharing-strategy"]


def a100_mig(gpu_index: int, mig_index: int, profile: str, gi_slices: int, ci: int) -> MigDevice:
    """A MIG device with NVML's attributes filled in."""
    return replace(
        b.mig(gpu_index, mig_index, profile),
        multiprocessors=14 * ci,
        gi_slices=gi_slices,
        ci_slices=ci,
        engines=MigEngines(copy=ci, decoder=ci // 2, encoder=0, jpeg=1, ofa=1),
    )


def with_migs(index: int, *migs: MigDevice) -> Gpu:
    return replace(b.gpu(index, mig_enabled=True), mig_devices=migs)


# --- full GPUs and the -SHARED rule ------------------------------------------------------


def test_unshared_gpus_have_one_replica_and_no_strategy() -> None:
    got = labels(MIG_NONE, b.gpu(0), b.gpu(1))
    assert base(got) == ("NVIDIA-A100-SXM4-40GB", "2", "1", "none")


@pytest.mark.parametrize("strategy", [TIME_SLICING, MPS])
def test_shared_gpus_get_the_suffix_replicas_and_strategy(strategy: str) -> None:
    got = node_labels(b.snapshot(*b.gpus(2)), b.settings(MIG_NONE, SHARED_GPU, strategy=strategy))
    assert base(got) == ("NVIDIA-A100-SXM4-40GB-SHARED", "2", "4", strategy)


def test_count_is_physical_gpus_not_replicas() -> None:
    got = labels(MIG_NONE, *b.gpus(8), rules=(ReplicaRule(GPU, 10),))
    assert group(got, GPU)["count"] == "8"


def test_renamed_resource_is_shared_without_the_suffix() -> None:
    """renameByDefault advertises nvidia.com/gpu.shared; labels stay keyed nvidia.com/gpu."""
    got = labels(MIG_NONE, b.gpu(0), rules=(RENAMED_GPU,))
    assert base(got) == ("NVIDIA-A100-SXM4-40GB", "1", "4", TIME_SLICING)
    assert not [k for k in got if k.startswith("nvidia.com/gpu.shared")]


def test_a_rule_for_another_resource_leaves_gpu_unshared() -> None:
    got = labels(MIG_NONE, b.gpu(0), rules=(ReplicaRule("nvidia.com/mig-1g.5gb", 2),))
    assert base(got) == ("NVIDIA-A100-SXM4-40GB", "1", "1", "none")


def test_product_is_the_sanitised_model_name() -> None:
    got = labels(MIG_NONE, b.gpu(0, name="Tesla T4"), rules=(SHARED_GPU,))
    assert group(got, GPU)["product"] == "Tesla-T4-SHARED"


def test_mig_enabled_gpus_listed_as_full_gpus_have_zero_replicas_and_no_sharing() -> None:
    got = labels(MIG_NONE, b.gpu(0, profiles=["1g.5gb"]), rules=(SHARED_GPU,))
    assert base(got) == ("NVIDIA-A100-SXM4-40GB", "1", "0", "none")


def test_one_mig_disabled_gpu_makes_the_model_shared_and_counts_all_of_it() -> None:
    """Upstream's full-GPU group counts every GPU of the model, MIG-enabled or not."""
    got = labels(MIG_NONE, b.gpu(0, profiles=["1g.5gb"]), b.gpu(1), rules=(SHARED_GPU,))
    assert base(got) == ("NVIDIA-A100-SXM4-40GB-SHARED", "2", "4", TIME_SLICING)


# --- several GPU models ------------------------------------------------------------------


def test_several_models_label_the_first_mig_disabled_model_and_warn() -> None:
    t4 = replace(b.gpu(2, name="Tesla T4", memory_mib=15360), compute_capability=(7, 5))
    snap = b.snapshot(b.gpu(0, profiles=["1g.5gb"]), t4, b.gpu(3))
    result = label_node(snap, b.settings(MIG_NONE))
    g = group(result.labels, GPU)
    assert (g["product"], g["count"], g["memory"], g["family"]) == (
        "Tesla-T4",
        "1",
        "15360",
        "turing",
    )
    assert any("several GPU models" in w and "Tesla T4" in w for w in result.warnings)


def test_several_models_all_mig_enabled_label_the_lowest_index() -> None:
    other = b.gpu(1, name="NVIDIA A30", profiles=["1g.6gb"])
    got = labels(MIG_NONE, b.gpu(0, profiles=["1g.5gb"]), other)
    assert base(got) == ("NVIDIA-A100-SXM4-40GB", "1", "0", "none")


# --- MIG single --------------------------------------------------------------------------


def test_single_labels_the_mig_device_as_the_gpu() -> None:
    gpus = [with_migs(i, *(a100_mig(i, j, "3g.20gb", 3, 3) for j in range(2))) for i in range(2)]
    got = labels(MIG_SINGLE, *gpus)
    assert base(got) == ("NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", "4", "1", "none")
    g = group(got, GPU)
    assert g["memory"] == "19968"  # the MIG device's, not the GPU's
    assert (g["multiprocessors"], g["slices.gi"], g["slices.ci"]) == ("42", "3", "3")
    engines = [g[f"engines.{e}"] for e in ("copy", "decoder", "encoder", "jpeg", "ofa")]
    assert engines == ["3", "1", "0", "1", "1"]
    assert (g["family"], got["nvidia.com/mig.strategy"]) == ("ampere", MIG_SINGLE)


def test_single_shares_the_mig_devices_by_the_gpu_rule() -> None:
    gpu = with_migs(0, a100_mig(0, 0, "1g.5gb", 1, 1), a100_mig(0, 1, "1g.5gb", 1, 1))
    assert base(labels(MIG_SINGLE, gpu, rules=(SHARED_GPU,))) == (
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
        "2",
        "4",
        TIME_SLICING,
    )
    renamed = base(labels(MIG_SINGLE, gpu, rules=(RENAMED_GPU,)))
    assert renamed[0] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"


def test_single_without_mig_enabled_gpus_labels_full_gpus() -> None:
    got = labels(MIG_SINGLE, b.gpu(0), b.gpu(1), rules=(SHARED_GPU,))
    assert base(got) == ("NVIDIA-A100-SXM4-40GB-SHARED", "2", "4", TIME_SLICING)
    assert got["nvidia.com/mig.strategy"] == MIG_SINGLE
    assert "nvidia.com/gpu.slices.gi" not in got


@pytest.mark.parametrize(
    ("gpus", "reason"),
    [
        ((b.gpu(0, profiles=["1g.5gb"]), b.gpu(1, mig_enabled=True)), "no MIG devices"),
        ((b.gpu(0, profiles=["1g.5gb"]), b.gpu(1)), "enabled and some disabled"),
        ((b.gpu(0, profiles=["1g.5gb", "2g.10gb"]),), "more than one MIG device type"),
    ],
)
def test_invalid_single_layouts_are_labelled_mig_invalid(
    gpus: tuple[Gpu, ...], reason: str
) -> None:
    result = label_node(b.snapshot(*gpus), b.settings(MIG_SINGLE, SHARED_GPU))
    g = group(result.labels, GPU)
    assert (g["product"], g["count"], g["replicas"], g["memory"]) == (
        "NVIDIA-A100-SXM4-40GB-MIG-INVALID",
        "0",
        "0",
        "0",
    )
    assert g["sharing-strategy"] == ""
    assert "multiprocessors" not in g
    assert any(reason in w and "MIG-INVALID" in w for w in result.warnings)


# --- MIG mixed ---------------------------------------------------------------------------


def test_mixed_labels_one_group_per_profile() -> None:
    gpu0 = with_migs(0, a100_mig(0, 0, "3g.20gb", 3, 3), a100_mig(0, 1, "1g.5gb", 1, 1))
    gpu1 = with_migs(1, a100_mig(1, 0, "1g.5gb", 1, 1))
    got = labels(MIG_MIXED, gpu0, gpu1, b.gpu(2))
    small = group(got, "nvidia.com/mig-1g.5gb")
    assert (small["product"], small["count"], small["replicas"]) == (
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "2",
        "1",
    )
    assert (small["memory"], small["slices.gi"], small["engines.copy"]) == ("4864", "1", "1")
    assert group(got, "nvidia.com/mig-3g.20gb")["count"] == "1"
    assert group(got, GPU)["count"] == "3"  # every A100, MIG-enabled or not
    assert got["nvidia.com/mig.strategy"] == MIG_MIXED


def test_mixed_groups_follow_their_own_sharing_rules() -> None:
    gpu = with_migs(0, a100_mig(0, 0, "1g.5gb", 1, 1), a100_mig(0, 1, "2g.10gb", 2, 2))
    rules = (ReplicaRule("nvidia.com/mig-1g.5gb", 2), ReplicaRule("nvidia.com/mig-7g.40gb", 3))
    got = labels(MIG_MIXED, gpu, rules=rules)
    assert base(got, "nvidia.com/mig-1g.5gb") == (
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED",
        "1",
        "2",
        TIME_SLICING,
    )
    assert base(got, "nvidia.com/mig-2g.10gb") == (
        "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb",
        "1",
        "1",
        "none",
    )
    assert not group(got, "nvidia.com/mig-7g.40gb")
    renamed = (ReplicaRule("nvidia.com/mig-1g.5gb", 2, rename="nvidia.com/mig-1g.5gb.shared"),)
    assert base(labels(MIG_MIXED, gpu, rules=renamed), "nvidia.com/mig-1g.5gb")[:3] == (
        "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "1",
        "2",
    )


def test_mixed_keys_turn_plus_into_dot_and_products_drop_it() -> None:
    gpu = with_migs(0, replace(a100_mig(0, 0, "1g.10gb+me", 1, 1), memory_mib=9856))
    got = labels(MIG_MIXED, gpu, rules=(ReplicaRule("nvidia.com/mig-1g.10gb.me", 2),))
    g = group(got, "nvidia.com/mig-1g.10gb.me")
    assert (g["product"], g["replicas"]) == ("NVIDIA-A100-SXM4-40GB-MIG-1g.10gbme-SHARED", "2")
    assert not [k for k in got if "+" in k]


def test_mixed_ignores_mig_enabled_gpus_without_mig_devices() -> None:
    got = labels(MIG_MIXED, b.gpu(0, mig_enabled=True), b.gpu(1))
    assert not [k for k in got if k.startswith("nvidia.com/mig-")]
    assert base(got) == ("NVIDIA-A100-SXM4-40GB", "2", "1", "none")


def test_mixed_warns_about_a_mig_enabled_gpu_without_mig_devices() -> None:
    """Upstream logs a warning for it; ours reaches label_node's warnings, which
    `gpuslice inspect` reports and the labeller logs."""
    result = label_node(b.snapshot(b.gpu(0, mig_enabled=True), b.gpu(1)), b.settings(MIG_MIXED))
    assert result.warnings == (
        f"migStrategy mixed: MIG-enabled GPU 0 ({b.gpu_uuid(0)}) has no MIG devices; "
        "nothing is advertised from it",
    )
    full = label_node(b.snapshot(b.gpu(0, profiles=["1g.5gb"]), b.gpu(1)), b.settings(MIG_MIXED))
    assert full.warnings == ()


def test_none_strategy_has_no_mig_labels() -> None:
    got = labels(MIG_NONE, with_migs(0, a100_mig(0, 0, "1g.5gb", 1, 1)))
    assert "nvidia.com/mig.strategy" not in got
    assert not [k for k in got if k.startswith("nvidia.com/mig-")]
    assert "nvidia.com/gpu.slices.gi" not in got
