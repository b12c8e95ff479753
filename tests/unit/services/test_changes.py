"""The start and reload log lines' descriptions of what is served."""

from __future__ import annotations

from gpuslice.adapters.fake import load_spec
from gpuslice.services.changes import gpus, resource_changes, served


def test_changes_list_each_resource_before_and_after() -> None:
    assert resource_changes({"nvidia.com/gpu": 16}, {"nvidia.com/gpu": 32}) == (
        "nvidia.com/gpu 16 -> 32 devices"
    )
    assert resource_changes({"nvidia.com/gpu": 16}, {"nvidia.com/gpu.shared": 16}) == (
        "nvidia.com/gpu removed (16 devices), nvidia.com/gpu.shared added with 16 devices"
    )
    assert resource_changes({"a": 1, "b": 2}, {"a": 1, "b": 2}) == "no resource changed"


def test_served_and_gpus_are_one_short_line() -> None:
    assert served({"nvidia.com/mig-1g.5gb": 7, "nvidia.com/gpu": 4}) == (
        "nvidia.com/gpu 4 devices, nvidia.com/mig-1g.5gb 7 devices"
    )
    assert served({}) == "nothing"
    assert gpus(load_spec("t4x4")) == "4x Tesla T4"
    assert gpus(load_spec("a100-40gb-mig-mixed")) == (
        "1x NVIDIA A100-SXM4-40GB (MIG enabled), 1x NVIDIA A100-SXM4-40GB"
    )
