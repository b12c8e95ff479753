"""The MIG layout planner: from a mig-parted config's entries and the node's GPUs, the
layout each GPU should have, what differs from the one it has, and the ordered steps that
get there. GPUs whose layout does not change get no step; a GPU that must change while a
device on it is in use is held back, naming what holds it. A layout that cannot be made
refuses the whole config (ConfigError), so nothing changes anywhere."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuslice.core.devices import Gpu
from gpuslice.core.errors import ConfigError
from gpuslice.core.mig import (
    GpuInstance,
    MigConfigEntry,
    MigProfileSpec,
    Placement,
    mode_change_resets,
    split_profile,
)
from gpuslice.core.mig_placement import place


@dataclass(frozen=True, slots=True)
class MigGpu:
    """What the planner knows of one GPU: its facts, its MIG profiles and instances
    (MigControl), and who holds its devices (device UUID -> pods or processes)."""

    gpu: Gpu
    profiles: tuple[MigProfileSpec, ...] = ()
    instances: tuple[GpuInstance, ...] = ()
    holders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Wanted:
    mig_enabled: bool
    devices: tuple[str, ...] = ()  # one profile per MIG device, sorted


@dataclass(frozen=True, slots=True)
class Destroy:
    gi: int
    profile: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class SetMode:
    enabled: bool
    resets: bool  # the change resets the GPU (Ampere): dangerous, only when idle


@dataclass(frozen=True, slots=True)
class Create:
    profile: str
    placement: Placement


Step = Destroy | SetMode | Create


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """One GPU's plan. `wanted` is None where no entry names the GPU (left alone). The
    steps run in order, and only when `held` is empty."""

    index: int
    uuid: str
    wanted: Wanted | None
    steps: tuple[Step, ...] = ()
    held: str = ""  # why the change waits: what holds the GPU's devices


def wanted_layout(entries: Sequence[MigConfigEntry], gpu: Gpu) -> Wanted | None:
    """The layout the last matching entry gives `gpu`; None when no entry names it or
    it cannot do MIG (a `devices: all` entry skips such GPUs, as mig-parted does)."""
    wanted: Wanted | None = None
    for entry in entries:
        if entry.devices is not None and gpu.index not in entry.devices:
            continue
        ids = (gpu.pci_device_id, gpu.pci_subsystem_id)
        if entry.device_filter and not any(f.matches(*ids) for f in entry.device_filter):
            continue
        if not gpu.mig_capable:
            if entry.devices is not None and entry.mig_enabled:
                raise ConfigError(f"{_name(gpu)}: MIG is asked for, but the GPU cannot do MIG")
            continue
        names = (name for name, count in entry.mig_devices for _ in range(count))
        wanted = Wanted(entry.mig_enabled, tuple(sorted(names)))
    return wanted


def plan_layout(entries: Sequence[MigConfigEntry], gpus: Sequence[MigGpu]) -> tuple[GpuPlan, ...]:
    """Every GPU's plan. ConfigError (one line) when a GPU's layout cannot be made."""
    return tuple(_plan(entries, g) for g in gpus)


def _plan(entries: Sequence[MigConfigEntry], node: MigGpu) -> GpuPlan:
    gpu = node.gpu
    wanted = wanted_layout(entries, gpu)
    if wanted is None:
        return GpuPlan(gpu.index, gpu.uuid, None)
    steps = _steps(node, wanted, _check(node, wanted))
    return GpuPlan(gpu.index, gpu.uuid, wanted, steps, _held(node) if steps else "")


def _check(node: MigGpu, wanted: Wanted) -> list[tuple[str, MigProfileSpec]]:
    """Each wanted device with its GPU-instance profile; ConfigError when the GPU has no
    such profile, allows fewer, or cannot hold them all."""
    by_name = {p.name: p for p in node.profiles}
    pairs = []
    for name in wanted.devices:
        base, compute, slices = split_profile(name)
        spec = by_name.get(base)
        if spec is None or compute > slices:
            known = ", ".join(sorted(by_name)) or "none"
            raise ConfigError(f"{_name(node.gpu)}: no MIG profile {name} (the GPU has: {known})")
        pairs.append((name, spec))
    counts = Counter(spec.name for _, spec in pairs)
    for spec_name, count in sorted(counts.items()):
        allowed = by_name[spec_name].instance_count
        if count > allowed:
            raise ConfigError(
                f"{_name(node.gpu)}: {count} x {spec_name} asked for; the GPU allows "
                f"{allowed} at once"
            )
    have = max((p.slices for p in node.profiles), default=0)
    asked = sum(spec.slices for _, spec in pairs)
    if asked > have:
        raise ConfigError(
            f"{_name(node.gpu)}: {_listing(wanted.devices)} is {asked} slices, more slices "
            f"than the GPU has ({have})"
        )
    if place([spec for _, spec in pairs]) is None:
        raise ConfigError(
            f"{_name(node.gpu)}: {_listing(wanted.devices)} cannot be placed together on "
            "the GPU's placements"
        )
    return pairs


def _steps(
    node: MigGpu, wanted: Wanted, pairs: list[tuple[str, MigProfileSpec]]
) -> tuple[Step, ...]:
    gpu, now = node.gpu, sorted(node.instances, key=lambda i: i.placement)
    resets = mode_change_resets(gpu.architecture)
    if not wanted.mig_enabled:
        return (*_destroys(now), SetMode(False, resets)) if gpu.mig_enabled else ()
    # One compute instance per GPU instance, as this planner makes them, and none missing.
    single = len({i.gi for i in now}) == len(now) and all(i.ci >= 0 for i in now)
    if gpu.mig_enabled and single and sorted(i.profile for i in now) == list(wanted.devices):
        return ()
    kept = _kept(now, wanted) if gpu.mig_enabled else []
    missing = Counter(wanted.devices) - Counter(i.profile for i in kept)
    todo = []
    for name, spec in pairs:
        if missing[name] > 0:
            missing[name] -= 1
            todo.append((name, spec))
    placed = place([s for _, s in todo], [i.placement for i in kept])
    if placed is None:  # what is kept is in the way: start again from an empty GPU
        kept, todo, placed = [], pairs, place([s for _, s in pairs])
        assert placed is not None  # _check placed them all
    mode = () if gpu.mig_enabled else (SetMode(True, resets),)
    gone = [i for i in now if i not in kept]
    return (*_destroys(gone), *mode, *_creates(placed, [n for n, _ in todo]))


def _kept(now: list[GpuInstance], wanted: Wanted) -> list[GpuInstance]:
    """The instances the wanted layout can keep where they are, lowest placement first;
    a GPU instance is kept whole or not at all."""
    left = Counter(wanted.devices)
    kept = []
    for instance in now:
        if instance.ci >= 0 and left[instance.profile] > 0:
            left[instance.profile] -= 1
            kept.append(instance)
    gone = {i.gi for i in now if i not in kept}
    return [i for i in kept if i.gi not in gone]


def _destroys(instances: Sequence[GpuInstance]) -> list[Step]:
    """One Destroy per GPU instance (it takes its compute instances with it)."""
    first = {i.gi: i for i in reversed(instances)}
    return [Destroy(i.gi, i.profile, i.placement) for i in instances if first[i.gi] is i]


def _creates(
    placed: Sequence[tuple[MigProfileSpec, Placement]], names: Sequence[str]
) -> list[Step]:
    """A Create per placed profile, named by the wanted device it is for."""
    left = list(names)
    steps: list[Step] = []
    for spec, placement in placed:
        name = next(n for n in left if split_profile(n)[0] == spec.name)
        left.remove(name)
        steps.append(Create(name, placement))
    return steps


def _held(node: MigGpu) -> str:
    """What holds the GPU's devices ("" when nothing does)."""
    labels = {i.uuid: f"{i.uuid} ({i.profile})" for i in node.instances if i.uuid}
    labels[node.gpu.uuid] = f"{node.gpu.uuid} (the whole GPU)"
    held = [
        f"{labels.get(device, device)} by {', '.join(who)}"
        for device, who in sorted(node.holders.items())
        if who and device in labels
    ]
    if not held:
        return ""
    return f"{_name(node.gpu)}: the layout must change, but its devices are in use: " + "; ".join(
        held
    )


def _listing(devices: Sequence[str]) -> str:
    counts = Counter(devices)
    return ", ".join(f"{counts[n]} x {n}" for n in sorted(counts))


def _name(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.name})" if gpu.name else f"GPU {gpu.index}"
