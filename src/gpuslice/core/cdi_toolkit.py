"""The NVIDIA Container Toolkit's own CDI devices, named beside gpuslice's.

gpuslice's CDI specs inject device nodes only. The driver's libraries and binaries (what
makes a CUDA container work) come from the spec the toolkit generates (since 1.18, as
/var/run/cdi/nvidia.yaml), of kind nvidia.com/gpu, with devices named by UUID, by
index ("0"; "0:1" for MIG device 1 of GPU 0) and "all". Under a cdi-* strategy each
allocated device is also named from that spec, by UUID where the spec has it, else by
index. Pure: the adapter reads the specs, the device-plugin and DRA front-ends name
devices from the ToolkitDevices found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TOOLKIT_KIND = "nvidia.com/gpu"
NOT_LOOKED_UP = "the CDI spec directory was not read"


@dataclass(frozen=True, slots=True)
class ToolkitDevices:
    """The device names of the toolkit's spec; `problem` says why there are none."""

    names: frozenset[str] = frozenset()
    source: str = ""  # the spec file the names come from
    problem: str | None = NOT_LOOKED_UP

    def name_for(self, physical_id: str, index: str) -> str | None:
        """`nvidia.com/gpu=<uuid>` (or `=<index>`) for one device; None: not in the spec."""
        found = next((i for i in (physical_id, index) if i in self.names), None)
        return None if found is None else f"{TOOLKIT_KIND}={found}"


def toolkit_names(doc: object) -> frozenset[str] | None:
    """The device names of a parsed CDI spec of the toolkit's kind; None for any other
    document (another kind, or not a spec)."""
    if not isinstance(doc, Mapping) or doc.get("kind") != TOOLKIT_KIND:
        return None
    devices = doc.get("devices")
    if not isinstance(devices, list):
        return None
    names = (d.get("name") for d in devices if isinstance(d, Mapping))
    return frozenset(n for n in names if isinstance(n, str) and n)


def missing(directory: str, detail: str = "") -> ToolkitDevices:
    why = f" ({detail})" if detail else ""
    return ToolkitDevices(
        problem=f"no CDI spec of kind {TOOLKIT_KIND} in {directory}{why}: containers get "
        "gpuslice's device nodes but not the driver's libraries; install the NVIDIA "
        "Container Toolkit 1.18 or later (it writes /var/run/cdi/nvidia.yaml), or run "
        "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml"
    )
