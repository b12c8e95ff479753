"""Upstream's load-time rules, applied to every freshly decoded config.

NVIDIA's binaries validate `resources`, `rename` and `devices` and then override them:
custom naming and device selection are not offered. We do the same, and say so in warnings.
The failRequestsGreaterThanOne default of the block in force is written out, so a dump of
the effective config shows the value that applies.
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec.structs import replace

from gpuslice.config.resource_names import SHARED_SUFFIX
from gpuslice.config.v1 import Config, ReplicatedResources, Resources

_Warn = Callable[[str, str], None]


def apply_load_rules(config: Config, source: str) -> tuple[Config, tuple[str, ...]]:
    """The config as upstream would run it, plus warnings (`source: path: text`)."""
    warnings: list[str] = []

    def warn(path: str, text: str) -> None:
        warnings.append(f"{source}: {path}: {text}")

    if config.resources != Resources():
        warn("resources", "custom resource naming is not supported (as upstream); ignored")
        config = replace(config, resources=Resources())
    sharing = config.sharing
    if sharing.mps is not None and sharing.time_slicing is not None:
        warn("sharing", "both timeSlicing and mps are set; mps is used, timeSlicing is ignored")
    blocks = {
        attr: _reset(block, f"sharing.{key}", warn)
        for attr, key, block in (
            ("time_slicing", "timeSlicing", sharing.time_slicing),
            ("mps", "mps", sharing.mps),
        )
        if block is not None
    }
    sharing = replace(sharing, **blocks)
    active = "mps" if sharing.mps is not None else "time_slicing"
    block = sharing.replicated
    if block is not None and block.fail_requests_greater_than_one is None:
        fail = sharing.fail_requests_greater_than_one
        sharing = replace(sharing, **{active: replace(block, fail_requests_greater_than_one=fail)})
    return replace(config, sharing=sharing), tuple(warnings)


def _reset(block: ReplicatedResources, path: str, warn: _Warn) -> ReplicatedResources:
    seen: set[str] = set()
    entries = []
    for i, entry in enumerate(block.resources):
        at = f"{path}.resources[{i}]"
        if entry.name in seen:
            warn(f"{at}.name", f"{entry.name} is listed more than once; the first entry is used")
        seen.add(entry.name)
        rename = entry.name + SHARED_SUFFIX if block.rename_by_default else ""
        if entry.rename and entry.rename != rename:
            target = rename or entry.name
            warn(f"{at}.rename", f"renaming is not supported (as upstream); advertised as {target}")
        if entry.devices != "all":
            warn(f"{at}.devices", "selecting devices is not supported (as upstream); using all")
        # A resource a GPU can have is short enough to take the .shared suffix.
        entries.append(replace(entry, rename=rename, devices="all"))
    return replace(block, resources=tuple(entries))
