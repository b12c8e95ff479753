"""The per-resource label groups of GPU Feature Discovery: nvidia.com/gpu.* and, under the
mixed MIG strategy, nvidia.com/mig-<profile>.*.

Upstream's rules, kept exactly:
- gpu.* describes the GPU model; count is every physical GPU of that model. A model whose
  GPUs all have MIG enabled is labelled without sharing (replicas 0, strategy none).
- A group is shared when a sharing rule names its resource with replicas > 1; the product
  then ends in -SHARED unless the rule renames the resource (renameByDefault).
- MIG single overrides gpu.* with the MIG device's product, count and attributes, or with
  <model>-MIG-INVALID when the layout breaks the single strategy's rules.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from functools import partial

from gpuslice.core.devices import Gpu, MigDevice
from gpuslice.core.errors import HardwareError
from gpuslice.core.label_shares import group_plan, per_gpu, renamed_groups
from gpuslice.core.resources import layout_warnings, mig_resource_name
from gpuslice.core.sharing import (
    GPU_RESOURCE,
    MIG_MIXED,
    MIG_NONE,
    MIG_SINGLE,
    NONE,
    ReplicaRule,
    ResourceSettings,
    SharingPlan,
)

Warn = Callable[[str], None]

_UNSAFE = re.compile(r"[^A-Za-z0-9\-_. ]")


def sanitise(value: str) -> str:
    """Upstream's label-value cleaning: drop characters outside [A-Za-z0-9-_. ], then
    join the remaining words with '-' ("Tesla T4" -> "Tesla-T4")."""
    return "-".join(_UNSAFE.sub("", value).split())


def family(major: int, minor: int) -> str:
    """GPU family from the compute capability, as upstream names it."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    names = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    names |= {10: "blackwell", 12: "blackwell", 13: "rubin"}
    return names.get(major, "undefined")


def resource_labels(
    gpus: tuple[Gpu, ...], settings: ResourceSettings, warn: Warn
) -> dict[str, str]:
    """gpu.*, mig.strategy and the MIG groups of the settings' MIG strategy, plus the
    groups of renamed resources under per-GPU sharing (label_shares)."""
    plan = settings.sharing
    view = per_gpu(gpus, settings)
    labels: dict[str, str] = {}
    if view is not None:
        plan = group_plan(view, plan)
        product = partial(_product, rule=None)
        labels = renamed_groups(view, gpus, plan.strategy, product, warn)
    labels |= _full_gpu_labels(gpus, plan, warn)
    strategy = settings.mig_strategy
    if strategy == MIG_NONE:
        return labels
    if strategy == MIG_SINGLE:
        labels |= _single_labels(gpus, plan, warn)
    elif strategy == MIG_MIXED:
        labels |= _mixed_labels(gpus, plan)
        for warning in layout_warnings(gpus, strategy):
            warn(warning)
    else:
        raise HardwareError(f"unknown MIG strategy {strategy!r}: use none, single or mixed")
    labels["nvidia.com/mig.strategy"] = strategy
    return labels


def _full_gpu_labels(gpus: tuple[Gpu, ...], plan: SharingPlan, warn: Warn) -> dict[str, str]:
    # Upstream labels each model in turn, MIG-enabled ones first, and the last one written
    # wins, so a model with a MIG-disabled GPU beats one without. Among equals its order is
    # random; ours is the lowest GPU index.
    counts = Counter(g.name for g in gpus)
    plain = [g for g in gpus if not g.mig_enabled]
    chosen = plain[0] if plain else gpus[0]
    if len(counts) > 1:
        models = ", ".join(f"{n} x{c}" for n, c in counts.items())
        warn(f"several GPU models on the node ({models}); gpu.* labels describe {chosen.name}")
    labels = _base(GPU_RESOURCE, counts[chosen.name], (chosen.name,), plan if plain else None)
    if chosen.memory_mib:
        labels[f"{GPU_RESOURCE}.memory"] = str(chosen.memory_mib)
    major, minor = chosen.compute_capability
    if major:
        labels[f"{GPU_RESOURCE}.family"] = family(major, minor)
        labels[f"{GPU_RESOURCE}.compute.major"] = str(major)
        labels[f"{GPU_RESOURCE}.compute.minor"] = str(minor)
    return labels


def _single_labels(gpus: tuple[Gpu, ...], plan: SharingPlan, warn: Warn) -> dict[str, str]:
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return {}
    if any(not g.mig_devices for g in enabled):
        return _invalid(enabled[0], "a MIG-enabled GPU has no MIG devices", warn)
    if len(enabled) != len(gpus):
        return _invalid(enabled[0], "some GPUs have MIG enabled and some disabled", warn)
    migs = [(g, m) for g in enabled for m in g.mig_devices]
    if len({m.profile for _, m in migs}) > 1:
        return _invalid(enabled[0], "more than one MIG device type present on node", warn)
    gpu, mig = migs[0]
    return _mig_group(GPU_RESOURCE, gpu, mig, len(migs), plan)


def _invalid(gpu: Gpu, reason: str, warn: Warn) -> dict[str, str]:
    product = _product((gpu.name, "MIG", "INVALID"), None)
    warn(f"migStrategy single: {reason}; gpu.product is {product}")
    return _keyed(
        GPU_RESOURCE,
        (("product", product), ("count", 0), ("replicas", 0), ("memory", 0)),
    ) | {f"{GPU_RESOURCE}.sharing-strategy": ""}


def _mixed_labels(gpus: tuple[Gpu, ...], plan: SharingPlan) -> dict[str, str]:
    first: dict[str, tuple[Gpu, MigDevice]] = {}
    counts: Counter[str] = Counter()
    for gpu in gpus:
        for mig in gpu.mig_devices if gpu.mig_enabled else ():
            name = mig_resource_name(mig.profile)
            first.setdefault(name, (gpu, mig))
            counts[name] += 1
    labels: dict[str, str] = {}
    for name, (gpu, mig) in first.items():
        labels |= _mig_group(name, gpu, mig, counts[name], plan)
    return labels


def _mig_group(
    resource: str, gpu: Gpu, mig: MigDevice, count: int, plan: SharingPlan
) -> dict[str, str]:
    engines = mig.engines
    attributes = (
        ("memory", mig.memory_mib),
        ("multiprocessors", mig.multiprocessors),
        ("slices.gi", mig.gi_slices),
        ("slices.ci", mig.ci_slices),
        ("engines.copy", engines.copy),
        ("engines.decoder", engines.decoder),
        ("engines.encoder", engines.encoder),
        ("engines.jpeg", engines.jpeg),
        ("engines.ofa", engines.ofa),
    )
    return _base(resource, count, (gpu.name, "MIG", mig.profile), plan) | _keyed(
        resource, attributes
    )


def _base(
    resource: str, count: int, parts: tuple[str, ...], plan: SharingPlan | None
) -> dict[str, str]:
    """product, count, replicas and sharing-strategy; plan None labels without sharing."""
    rule = _rule(plan, resource)
    replicas = 0 if plan is None else rule.replicas if rule else 1
    strategy = plan.strategy if plan is not None and replicas > 1 else NONE
    return _keyed(
        resource,
        (
            ("product", _product(parts, rule, plan.serving.product_suffix if plan else "")),
            ("count", count),
            ("replicas", replicas),
            ("sharing-strategy", strategy),
        ),
    )


def _rule(plan: SharingPlan | None, resource: str) -> ReplicaRule | None:
    if plan is None:
        return None
    return next((r for r in plan.rules if r.name == resource), None)


def _product(parts: tuple[str, ...], rule: ReplicaRule | None, suffix: str = "") -> str:
    """The parts as one label value, with the sharing strategy's `suffix` while `rule`
    replicates the resource under its own name."""
    words = [sanitise(p) for p in parts if p]
    if words and suffix and rule is not None and rule.replicas > 1 and not rule.rename:
        words.append(suffix)
    return "-".join(words)


def _keyed(resource: str, items: Iterable[tuple[str, object]]) -> dict[str, str]:
    return {f"{resource}.{suffix}": str(value) for suffix, value in items}
