"""One front-end per extended-resource name: the device plugin serves every resource
while DRA is off; with it on, only the names kept on the device-plugin API."""

from __future__ import annotations

from gpuslice.core.front_ends import dra_resources, split_front_ends
from gpuslice.core.resources import Resource

GPU, SHARED = Resource("nvidia.com/gpu", ()), Resource("nvidia.com/gpu.shared", ())


def names(resources: list[Resource]) -> list[str]:
    return [r.name for r in resources]


def test_with_dra_off_the_device_plugin_serves_everything() -> None:
    plugin, dra = split_front_ends([GPU, SHARED], None)
    assert (names(plugin), dra) == (["nvidia.com/gpu", "nvidia.com/gpu.shared"], [])


def test_with_dra_on_each_name_is_served_by_exactly_one_front_end() -> None:
    plugin, dra = split_front_ends([GPU, SHARED], {"nvidia.com/gpu.shared"})
    assert (names(plugin), names(dra)) == (["nvidia.com/gpu.shared"], ["nvidia.com/gpu"])
    assert names(dra_resources([GPU, SHARED], ())) == ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
