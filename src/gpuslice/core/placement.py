"""Per-GPU sharing: which advertised resource serves each device, with how many replicas.

Each sharing rule selects devices of its resource (`devices`) and serves them as
`replicas` shares under its name or its rename; a device no rule selects stays whole
under its own resource name. The choice depends only on the config and the devices'
indexes, never on the order the hardware reports them in:

- lists (indexes, GPU or MIG UUIDs) and `all` are resolved first; a device two of them
  select is a HardwareError naming both rules;
- then each count, in rule order, takes the lowest-index devices not yet taken;
- a reference this node lacks, or a count larger than what is left, is a warning;
- one advertised name draws on one resource only (never a GPU under two names), and
  under MPS every device of one advertised name has the same replicas (the daemon's
  thread limit is per resource).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuslice.core.errors import HardwareError
from gpuslice.core.sharing import ReplicaRule, SharingPlan

if TYPE_CHECKING:
    from gpuslice.core.resources import AdvertisedDevice


@dataclass(frozen=True, slots=True)
class ResourceShare:
    """How one device of a resource is served."""

    name: str  # the advertised resource
    replicas: int  # 1: whole


@dataclass(frozen=True, slots=True)
class Layout:
    placed: dict[str, ResourceShare]  # device ID -> placement, for every device of `base`
    warnings: tuple[str, ...]


def place(
    base: Mapping[str, Sequence[AdvertisedDevice]],
    plan: SharingPlan,
    aliases: Mapping[str, str] | None = None,
) -> Layout:
    """Place every device of `base` (resource -> devices in index order). `aliases` maps
    other spellings of a device ID (lowercase) to it: pre-R470 MIG UUIDs. Raises
    HardwareError for a device selected twice, a name served from two resources, or
    mixed replicas under MPS."""
    aliases = aliases or {}
    warnings: list[str] = []
    placed = {d.id: ResourceShare(name, 1) for name, devs in base.items() for d in devs}
    owner: dict[str, ReplicaRule] = {}
    rules = [r for r in plan.rules if r.name in base]
    for rule in (r for r in rules if not isinstance(r.devices, int)):
        for dev in _listed(rule, base, aliases, warnings):
            if dev.id in owner:
                raise HardwareError(
                    f"{_where(rule)}: device {dev.index} ({dev.physical_id}) is already "
                    f"selected by {_where(owner[dev.id])}; a device may be in one entry only"
                )
            owner[dev.id] = rule
    for rule, count in ((r, r.devices) for r in rules):
        if not isinstance(count, int):
            continue
        free = [d for d in base[rule.name] if d.id not in owner]
        if count > len(free):
            warnings.append(
                f"{_where(rule)}.devices: asks for {count} devices of {rule.name}; this node "
                f"has {len(free)} not taken by other entries, so {len(free)} are shared"
            )
        owner.update((d.id, rule) for d in free[:count])
    for device_id, rule in owner.items():
        placed[device_id] = ResourceShare(rule.advertised_name, rule.replicas)
    _check_served_once(base, placed, owner)
    if plan.serving.uniform_replicas:
        _check_uniform(base, placed, owner)
    return Layout(placed, tuple(warnings))


def _listed(
    rule: ReplicaRule,
    base: Mapping[str, Sequence[AdvertisedDevice]],
    aliases: Mapping[str, str],
    warnings: list[str],
) -> list[AdvertisedDevice]:
    devices, refs = base[rule.name], rule.devices
    if refs is None or isinstance(refs, int):
        return list(devices) if refs is None else []
    out: list[AdvertisedDevice] = []
    for ref in refs:
        key = _key(ref, aliases)
        found = [d for d in devices if key in (d.index, d.physical_id.lower())]
        if not found:
            elsewhere = [
                (n, d)
                for n, ds in base.items()
                for d in ds
                if key in (d.index, d.physical_id.lower())
            ]
            where = (
                f"it is served as {elsewhere[0][0]}, not {rule.name}"
                if elsewhere
                else "this node has no such device"
            )
            warnings.append(
                f'{_where(rule)}.devices: "{ref}" matches no {rule.name} here ({where}); skipped'
            )
        out.extend(d for d in found if d not in out)
    return out


def _key(ref: str, aliases: Mapping[str, str]) -> str:
    """An index without leading zeros ("01:2" -> "1:2"), or a lowercase UUID."""
    if ref[:1].isdigit():
        return ":".join(str(int(part)) for part in ref.split(":"))
    return aliases.get(ref.lower(), ref).lower()


def _check_served_once(
    base: Mapping[str, Sequence[AdvertisedDevice]],
    placed: Mapping[str, ResourceShare],
    owner: Mapping[str, ReplicaRule],
) -> None:
    sources: dict[str, str] = {}
    for name, devices in base.items():
        for dev in devices:
            target = placed[dev.id].name
            first = sources.setdefault(target, name)
            if first != name:
                rule = owner.get(dev.id)
                who = _where(rule) if rule else f"{name} (unshared devices keep their name)"
                raise HardwareError(
                    f"{who}: {target} would serve devices of both {first} and {name}; "
                    "one resource name must come from one resource: choose another rename"
                )


def _check_uniform(
    base: Mapping[str, Sequence[AdvertisedDevice]],
    placed: Mapping[str, ResourceShare],
    owner: Mapping[str, ReplicaRule],
) -> None:
    seen: dict[str, tuple[int, AdvertisedDevice]] = {}
    for devices in base.values():
        for dev in devices:
            where = placed[dev.id]
            replicas, first = seen.setdefault(where.name, (where.replicas, dev))
            if replicas != where.replicas:
                rule = owner.get(dev.id) or owner.get(first.id)
                assert rule is not None  # two whole devices cannot differ
                raise HardwareError(
                    f"{_where(rule)}: under sharing.mps every device of {where.name} needs "
                    f"the same replicas, but device {first.index} would be {_how(replicas)} and "
                    f"device {dev.index} {_how(where.replicas)}; select every device of "
                    f"{rule.name} or rename the entry (rename: {rule.name}.shared)"
                )


def _how(replicas: int) -> str:
    return "whole" if replicas == 1 else f"{replicas} replicas"


def _where(rule: ReplicaRule) -> str:
    return rule.path or f"sharing rule {rule.name}"
