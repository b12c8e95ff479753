"""The settings a node serves by: one immutable, complete, typed value per config load.

config.settings builds it (the config file or per-node entry, flags over env vars over
the file over defaults, the XID and recovery policies); everything below the command
line receives it as it is and never reads a flag or an env var.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.core.health import XidPolicy
from gpuslice.core.health_state import RecoveryPolicy
from gpuslice.core.isolation import MemoryPolicy
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import ResourceSettings


@dataclass(frozen=True, slots=True)
class Settings:
    """What the agent serves by, and where it came from (for logs and reports)."""

    resources: ResourceSettings
    allocate: AllocateOptions
    fail_on_init_error: bool = True
    xid_policy: XidPolicy = field(default_factory=XidPolicy)
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)
    name: str | None = None  # the ConfigMap entry or directory file; None for a plain file
    source: str = ""  # a path, "path[entry]", or how the defaults were reached
    summary: str = ""  # one line: MIG strategy, sharing, replica rules, device flags
    warnings: tuple[str, ...] = ()
    blank: bool = False  # the document had no content (see LoadedConfig.blank)
    labels: LabelSettings = field(default_factory=lambda: LabelSettings())
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)  # per-pod GPU memory limits

    @property
    def shown(self) -> str:
        """How logs and reports name this config."""
        return self.name or self.source or "(defaults)"


@dataclass(frozen=True, slots=True)
class LabelSettings:
    """How node labels are published (GPU Feature Discovery's flags.gfd, complete)."""

    use_node_feature_api: bool = True  # a NodeFeature object; False: a features.d file
    output_file: str = ""  # the features.d file ("" writes to stdout)
    interval_s: float | None = 60.0  # between relabellings; None: infinite (on changes only)
    timestamps: bool = True
    machine_type_file: str = ""
    oneshot: bool = False
