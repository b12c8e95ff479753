"""The proposed mig-parted config: the smallest profile holding each workload's peak
with the headroom advise uses, packed onto as few GPUs as the placements allow, and the
workloads left out named with the reason."""

from __future__ import annotations

import pytest

from gpuslice.adapters.fake import mig_tables
from gpuslice.config.mig_parted import parse_mig_parted
from gpuslice.core.advice import Advice, Rules, Series, SeriesFacts, advise
from gpuslice.core.advice_mig import fits, pack, propose_mig_config
from gpuslice.core.errors import ConfigError

MIB = 1024 * 1024
A100 = "NVIDIA A100-SXM4-40GB"
H200 = "NVIDIA H200"
T4 = "Tesla T4"
TABLES = {A100: mig_tables.A100_40GB, H200: mig_tables.H200}
SPECS = {s.name: s for s in mig_tables.A100_40GB}


def workloads(*rows: tuple[str, str, float, int]) -> list[Advice]:
    """(workload, model, peak MiB, pods) -> advice, each pod on a GPU of its own."""
    facts = {}
    for name, model, peak, pods in rows:
        for p in range(pods):
            f = SeriesFacts(share=0.25, smallest_share=0.25, gpu_memory=40960 * MIB)
            for _ in range(10):
                f.memory.add(peak * MIB)
            facts[Series("ns", f"{name}-{p}", "main", "nvidia.com/gpu", model, f"GPU-{p}")] = f
    return advise(facts, Rules(step_s=30, min_samples=10))


def test_each_workload_gets_the_smallest_profile_holding_its_peak_with_headroom() -> None:
    text = propose_mig_config(
        workloads(
            ("small", A100, 4400, 3),  # 4,840 MiB with 10 %: 1g.5gb (4,864 MiB)
            ("edge", A100, 4500, 1),  # 4,950 MiB: past 1g.5gb, 1g.10gb
            ("mid", A100, 17000, 2),  # 18,700 MiB: 3g.20gb
        ),
        TABLES,
    )
    assert "    # ns/small/main: 3 x 1g.5gb (peak 4,400 MiB)" in text
    assert "    # ns/edge/main: 1 x 1g.10gb (peak 4,500 MiB)" in text
    assert "    # ns/mid/main: 2 x 3g.20gb (peak 17,000 MiB)" in text
    (entries,) = parse_mig_parted(text).configs.values()
    # the two 3g.20gb fill one GPU's memory slices; the rest share a second
    assert [(e.devices, dict(e.mig_devices)) for e in entries] == [
        ((0,), {"3g.20gb": 2}),
        ((1,), {"1g.10gb": 1, "1g.5gb": 3}),
    ]


def test_one_layout_for_every_gpu_is_devices_all() -> None:
    text = propose_mig_config(workloads(("web", A100, 3000, 7)), TABLES)
    config = parse_mig_parted(text)
    assert list(config.configs) == ["advised-nvidia-a100-sxm4-40gb"]
    (entry,) = config.entries("advised-nvidia-a100-sxm4-40gb")
    assert (entry.devices, entry.mig_enabled, entry.mig_devices) == (None, True, (("1g.5gb", 7),))


def test_workloads_that_do_not_fit_mig_are_named_with_the_reason() -> None:
    text = propose_mig_config(
        workloads(("web", A100, 3000, 1), ("t4", T4, 1000, 1), ("huge", A100, 37000, 1)),
        TABLES,
    )
    assert "# left out: ns/huge/main on NVIDIA A100-SXM4-40GB: its peak 37,000 MiB with 10% " \
        "headroom exceeds every MIG profile" in text  # fmt: skip
    assert "# left out: ns/t4/main on Tesla T4: no MIG profiles known for the model" in text
    assert list(parse_mig_parted(text).configs) == ["advised-nvidia-a100-sxm4-40gb"]


def test_each_mig_capable_pool_gets_its_own_config() -> None:
    text = propose_mig_config(workloads(("a", A100, 3000, 2), ("h", H200, 30000, 2)), TABLES)
    config = parse_mig_parted(text)
    assert sorted(config.configs) == ["advised-nvidia-a100-sxm4-40gb", "advised-nvidia-h200"]
    assert config.entries("advised-nvidia-h200")[0].mig_devices == (("1g.35gb", 2),)


def test_no_workload_fitting_mig_is_one_error() -> None:
    with pytest.raises(ConfigError, match=r"^no workload fits a MIG profile: ns/t4/main on Tesla"):
        propose_mig_config(workloads(("t4", T4, 1000, 1)), TABLES)


def test_packing_respects_instance_counts_slices_and_placements() -> None:
    one, three, four = (SPECS[n] for n in ("1g.10gb", "3g.20gb", "4g.20gb"))
    assert fits([four, three], 7)
    assert not fits([one] * 5, 7)  # 1g.10gb: 4 placements
    assert not fits([SPECS["1g.5gb+me"]] * 2, 7)  # 7 placements, but one at a time
    assert not fits([three, three, SPECS["1g.5gb"]], 7)  # memory slices all taken
    assert [len(g) for g in pack([SPECS["1g.5gb"]] * 15, 7)] == [7, 7, 1]
