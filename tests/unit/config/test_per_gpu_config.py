"""Per-GPU sharing in the config: `rename` and `devices` are kept, renames resolved,
and what can be refused without hardware is refused with one line naming the entry."""

from __future__ import annotations

import pytest

from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import load_config
from gpuslice.config.summary import describe
from gpuslice.core.errors import ConfigError


def config(*entries: str, block: str = "timeSlicing", extra: str = "") -> str:
    lines = "".join(f"    - {{{e}}}\n" for e in entries)
    return f"version: v1\nsharing:\n  {block}:\n{extra}    resources:\n{lines}"


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(text, source="c.yaml")
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_two_entries_of_one_name_become_two_rules_with_their_paths() -> None:
    text = config(
        "name: gpu, replicas: 4, rename: gpu.shared, devices: [2, 3]",
        "name: gpu, replicas: 8, rename: gpu.small, devices: 1",
    )
    rules = resource_settings(load_config(text, source="c.yaml").config).sharing.rules
    assert [(r.advertised_name, r.replicas, r.devices, r.path) for r in rules] == [
        ("nvidia.com/gpu.shared", 4, ("2", "3"), "sharing.timeSlicing.resources[0]"),
        ("nvidia.com/gpu.small", 8, 1, "sharing.timeSlicing.resources[1]"),
    ]


def test_rename_by_default_fills_in_only_entries_without_a_rename() -> None:
    text = config(
        "name: gpu, replicas: 4, devices: [0]",
        "name: gpu, replicas: 8, rename: gpu.small, devices: [1]",
        extra="    renameByDefault: true\n",
    )
    rules = resource_settings(load_config(text, source="c.yaml").config).sharing.rules
    assert [r.advertised_name for r in rules] == ["nvidia.com/gpu.shared", "nvidia.com/gpu.small"]


def test_a_repeated_name_with_devices_all_keeps_upstreams_first_entry_rule() -> None:
    """Upstream's configs that list a name twice still load: the first entry is used."""
    loaded = load_config(
        config("name: gpu, replicas: 4", "name: gpu, replicas: 8"), source="c.yaml"
    )
    assert loaded.warnings == (
        "c.yaml: sharing.timeSlicing.resources[1].name: nvidia.com/gpu is listed more than "
        "once; the first entry is used",
    )
    rules = resource_settings(loaded.config).sharing.rules
    assert [r.replicas for r in rules] == [4]


def test_a_rename_onto_a_gpu_resource_name_is_refused() -> None:
    """nvidia.com/mig-1g.5gb exists on some nodes: it would be served twice there."""
    assert error_of(config("name: gpu, replicas: 4, rename: mig-1g.5gb, devices: [0]")) == (
        'c.yaml: sharing.timeSlicing.resources[0].rename: got "nvidia.com/mig-1g.5gb"; '
        "expected a name no GPU resource has (a resource of the node would be served twice "
        "under it), such as nvidia.com/gpu.shared"
    )


def test_one_advertised_name_from_two_resources_is_refused() -> None:
    text = config(
        "name: gpu, replicas: 4, rename: shared",
        "name: mig-1g.5gb, replicas: 2, rename: shared",
    )
    assert error_of(text) == (
        "c.yaml: sharing.timeSlicing.resources[1].rename: nvidia.com/shared is already "
        "served from nvidia.com/gpu by sharing.timeSlicing.resources[0]; one resource name "
        "must come from one resource: choose another rename"
    )


def test_mps_refuses_two_replica_counts_under_one_name() -> None:
    text = config(
        "name: gpu, replicas: 4, devices: [0]",
        "name: gpu, replicas: 2, devices: [1]",
        block="mps",
    )
    assert error_of(text).startswith(
        "c.yaml: sharing.mps.resources[1].replicas: got 2; expected 4 as "
        "sharing.mps.resources[0], which nvidia.com/gpu also comes from: under MPS"
    )


def test_time_slicing_allows_two_replica_counts_under_one_name() -> None:
    text = config("name: gpu, replicas: 4, devices: [0]", "name: gpu, replicas: 2, devices: [1]")
    assert load_config(text, source="c.yaml").warnings == ()


def test_the_summary_shows_the_selection() -> None:
    text = config("name: gpu, replicas: 4, rename: gpu.shared, devices: [2, 3]")
    summary = describe(load_config(text, source="c.yaml").config)
    assert "nvidia.com/gpu: 4 replicas, advertised as nvidia.com/gpu.shared, devices 2,3" in (
        summary
    )
