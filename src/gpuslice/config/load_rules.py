"""Load-time rules, applied to every freshly decoded config.

NVIDIA's binaries validate `resources`, `rename` and `devices` and then override them.
gpuslice ignores `resources` as upstream does (with a warning), but honours `rename` and
`devices` per sharing entry (per-GPU sharing, docs/config.md): a rename is resolved here
(explicit, else `<name>.shared` under renameByDefault) and the checks that need no
hardware are made; core.placement makes the rest on each node. The
failRequestsGreaterThanOne default of the block in force is written out, so a dump of the
effective config shows the value that applies.
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec.structs import replace

from gpuslice.config.checks import show
from gpuslice.config.decode import config_error
from gpuslice.config.resource_names import SHARED_SUFFIX
from gpuslice.config.v1 import Config, ReplicatedResource, ReplicatedResources, Resources
from gpuslice.core.resources import servable_name

_Warn = Callable[[str, str], None]


def apply_load_rules(config: Config, source: str) -> tuple[Config, tuple[str, ...]]:
    """The config as the agent runs it, plus warnings (`source: path: text`). Raises
    ConfigError for a rename or replica count per-GPU sharing cannot serve."""
    warnings: list[str] = []

    def warn(path: str, text: str) -> None:
        warnings.append(f"{source}: {path}: {text}")

    if config.resources != Resources():
        warn("resources", "custom resource naming is not supported (as upstream); ignored")
        config = replace(config, resources=Resources())
    sharing = config.sharing
    present = sharing.present
    for other in present[1:]:
        used = present[0].config_key
        warn("sharing", f"both {other.config_key} and {used} are set; {used} is used, "
             f"{other.config_key} is ignored")  # fmt: skip
    blocks = {
        s.config_attr: _resolve(block, f"sharing.{s.config_key}", warn, source, s.uniform_replicas)
        for s in reversed(sharing.present)
        if (block := sharing.block(s)) is not None
    }
    sharing = replace(sharing, **blocks)
    active = sharing.replicated_strategy.config_attr
    block = sharing.replicated
    if block is not None and block.fail_requests_greater_than_one is None:
        fail = sharing.fail_requests_greater_than_one
        sharing = replace(sharing, **{active: replace(block, fail_requests_greater_than_one=fail)})
    return replace(config, sharing=sharing), tuple(warnings)


def superseded(entries: tuple[ReplicatedResource, ...], i: int) -> bool:
    """True when entry i repeats an earlier entry's name, both with `devices: all`:
    upstream's rule, the first entry is used."""
    entry = entries[i]
    return entry.devices == "all" and any(
        e.name == entry.name and e.devices == "all" for e in entries[:i]
    )


def _resolve(
    block: ReplicatedResources, path: str, warn: _Warn, source: str, uniform: bool
) -> ReplicatedResources:
    """Renames resolved, a superseded entry warned about (kept in the config, unused),
    and the name checks made: each
    advertised name comes from one resource, never another GPU resource's name, and under
    a strategy with `uniform` replicas (MPS) has one replica count. Raises ConfigError."""
    entries: list[ReplicatedResource] = []
    where: dict[str, tuple[str, ReplicatedResource]] = {}  # advertised name -> first entry
    for i, entry in enumerate(block.resources):
        at = f"{path}.resources[{i}]"
        if superseded(block.resources, i):
            warn(f"{at}.name", f"{entry.name} is listed more than once; the first entry is used")
            entries.append(entry)
            continue
        rename = "" if entry.rename == entry.name else entry.rename
        if not rename and block.rename_by_default:
            rename = entry.name + SHARED_SUFFIX  # every GPU resource name takes the suffix
        entry = replace(entry, rename=rename)
        target = entry.advertised_name
        if rename and servable_name(rename):
            raise config_error(
                source,
                f"{at}.rename",
                f"got {show(rename)}; expected a name no GPU resource has (a resource of "
                f"the node would be served twice under it), such as {entry.name}{SHARED_SUFFIX}",
            )
        first_at, first = where.setdefault(target, (at, entry))
        if first.name != entry.name:
            raise config_error(
                source,
                f"{at}.rename" if rename else f"{at}.name",
                f"{target} is already served from {first.name} by {first_at}; one resource "
                "name must come from one resource: choose another rename",
            )
        if uniform and first.replicas != entry.replicas:
            raise config_error(
                source,
                f"{at}.replicas",
                f"got {entry.replicas}; expected {first.replicas} as {first_at}, which "
                f"{target} also comes from: under MPS every device of one resource has the "
                "same replicas (rename one entry to serve different replicas)",
            )
        entries.append(entry)
    return replace(block, resources=tuple(entries))
