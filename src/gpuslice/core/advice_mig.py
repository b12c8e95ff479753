"""A proposed mig-parted config (`version: v1`) from right-sizing advice. Per GPU model
(a node pool) that can do MIG, each workload gets the smallest MIG profile holding its
measured peak plus HEADROOM, one MIG device per pod seen in the window, packed onto as few
GPUs as the model's placements allow. A workload that cannot be served so is named with
the reason in a comment line and left out."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence

from gpuslice.core.advice import HEADROOM, MIB, Advice, smallest_profile
from gpuslice.core.advice_config import entry_name
from gpuslice.core.errors import ConfigError
from gpuslice.core.mig import MigProfileSpec
from gpuslice.core.mig_placement import place, placement_order

PREFIX = "advised-"  # the configs' names: advised-<model>


def propose_mig_config(
    advice: Sequence[Advice], tables: Mapping[str, Sequence[MigProfileSpec]]
) -> str:
    """The config, one named layout per MIG-capable model (`tables`: model name -> its
    GPU-instance profiles). ConfigError when no workload fits a MIG profile."""
    left_out: list[str] = []
    pools: dict[str, list[tuple[Advice, MigProfileSpec]]] = {}
    for a in sorted(advice, key=lambda a: (a.model, a.namespace, a.workload, a.container)):
        spec, why = _profile(a, tables.get(a.model, ()))
        if spec is None:
            left_out.append(f"{_who(a)} on {a.model or 'a GPU of unknown model'}: {why}")
        else:
            pools.setdefault(a.model, []).append((a, spec))
    if not pools:
        raise ConfigError("no workload fits a MIG profile: " + "; ".join(left_out))
    lines = [
        f"# Proposed MIG layouts from measured peaks with {HEADROOM:.0%} headroom, one MIG",
        "# device per pod seen. Label each pool's nodes nvidia.com/mig.config=<name>.",
        *(f"# left out: {line}" for line in left_out),
        "version: v1",
        "mig-configs:",
    ]
    for model, wanted in sorted(pools.items()):
        lines.append(f"  {PREFIX}{entry_name(model)}:")
        lines += [
            f"    # {_who(a)}: {a.pods} x {spec.name} (peak {(a.memory_max or 0) / MIB:,.0f} MiB)"
            for a, spec in wanted
        ]
        most = max(p.slices for p in tables[model])
        lines += _entries(pack([s for a, s in wanted for _ in range(a.pods)], most))
    return "\n".join(lines) + "\n"


def pack(specs: Sequence[MigProfileSpec], most_slices: int) -> list[list[MigProfileSpec]]:
    """Each GPU's instances: largest first, each on the first GPU it still fits on
    (instance counts, compute slices and placements), else on a new one."""
    gpus: list[list[MigProfileSpec]] = []
    for spec in sorted(specs, key=placement_order):
        gpu = next((g for g in gpus if fits([*g, spec], most_slices)), None)
        if gpu is None:
            gpus.append([spec])
        else:
            gpu.append(spec)
    return gpus


def fits(specs: Sequence[MigProfileSpec], most_slices: int) -> bool:
    """`specs` can be made together on one GPU of `most_slices` compute slices."""
    counts = Counter(s.name for s in specs)
    if any(counts[s.name] > s.instance_count for s in specs):
        return False
    return sum(s.slices for s in specs) <= most_slices and place(specs) is not None


def _profile(a: Advice, table: Sequence[MigProfileSpec]) -> tuple[MigProfileSpec | None, str]:
    if not table:
        return None, "no MIG profiles known for the model"
    if a.memory_max is None:
        return None, "no measured peak"
    # the +me profiles (all media engines) are one per GPU: not a default for a workload
    sizes = {p.name: p.memory_mib for p in table if "+" not in p.name}
    name = smallest_profile(a.memory_max, sizes)
    if name is None:
        peak = f"{a.memory_max / MIB:,.0f} MiB"
        return None, f"its peak {peak} with {HEADROOM:.0%} headroom exceeds every MIG profile"
    return next(p for p in table if p.name == name), ""


def _entries(gpus: list[list[MigProfileSpec]]) -> list[str]:
    """One entry per distinct layout: `devices: all` when every GPU has the same one,
    else the GPU indexes taking each."""
    layouts: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for index, gpu in enumerate(gpus):
        layouts.setdefault(tuple(Counter(s.name for s in gpu).items()), []).append(index)
    if len(layouts) > 1:
        lines = [f"    # {len(gpus)} GPUs: a node's GPU i takes the layout naming i"]
    else:
        lines = [f"    # {len(gpus)} GPU{'s' if len(gpus) > 1 else ''} of this layout"]
    for layout, indexes in layouts.items():
        devices = "all" if len(layouts) == 1 else json.dumps(indexes)
        lines += [f"    - devices: {devices}", "      mig-enabled: true", "      mig-devices:"]
        lines += [f"        {json.dumps(name)}: {count}" for name, count in layout]
    return lines


def _who(a: Advice) -> str:
    return f"{a.namespace}/{a.workload}/{a.container}"
