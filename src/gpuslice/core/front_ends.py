"""Which front-end serves which extended-resource name: per node, exactly one.

With DRA off every resource is the device plugin's. With it on, the resources named to
stay on the device-plugin API (`--dra-device-plugin-resources`) stay there and DRA serves
the others. Both front-ends and the planning commands split by this one rule.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from gpuslice.core.resources import Resource


def split_front_ends(
    resources: Iterable[Resource], device_plugin: Collection[str] | None
) -> tuple[list[Resource], list[Resource]]:
    """(the device plugin's, DRA's). With DRA off (`device_plugin` None) every resource is
    the device plugin's; with it on, those named in `device_plugin` stay there and DRA
    serves the others."""
    listed = list(resources)
    if device_plugin is None:
        return listed, []
    kept = [r for r in listed if r.name in device_plugin]
    return kept, [r for r in listed if r.name not in device_plugin]


def dra_resources(resources: Iterable[Resource], device_plugin: Collection[str]) -> list[Resource]:
    """The resources DRA serves: all but those kept on the device-plugin API."""
    return split_front_ends(resources, device_plugin)[1]
