"""Consumable capacity of a shared DRA device (Kubernetes 1.36, DRAConsumableCapacity).

A device published with `allowMultipleAllocations` is charged per claim: for each
capacity the claim does not request, the scheduler charges the capacity's request
policy default, and the full value where there is no policy. So every capacity of a
shared device carries a policy that lets its N sharers fit: `shares` 1 of N, `memory`
and `multiprocessors` 1/N each by default, and a range a claim may ask within instead
(`capacity.requests.memory: 4Gi`), rounded up to whole MiB or multiprocessors.

`charged_memory_mib` reads back what the scheduler charged a claim (the allocation
result's consumedCapacity): the GPU memory the claim is held to.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuslice.core.dra.devices import DraDevice, Json
from gpuslice.core.dra.fields import quantity_mib

SHARES, MEMORY, MULTIPROCESSORS = "shares", "memory", "multiprocessors"


def shared_capacity(device: DraDevice) -> dict[str, Json]:
    """The capacities of `device` published as shared by its `replicas` claims."""
    n = max(device.replicas, 1)
    out: dict[str, Json] = {}
    for name, value in device.capacity.items():
        out[name] = {"value": value}
        if name == MEMORY and value.endswith("Mi") and value[:-2].isdigit():
            total = int(value[:-2])
            out[name]["requestPolicy"] = _range(max(total // n, 1), total, "Mi")
        elif name == MULTIPROCESSORS and value.isdigit():
            total = int(value)
            out[name]["requestPolicy"] = _range(max(total // n, 1), total, "")
        elif value.isdigit():  # an engine count: not split, every sharer uses the engines
            out[name]["requestPolicy"] = {"default": "0", "validValues": ["0"]}
    out[SHARES] = {"value": str(n), "requestPolicy": _range(1, n, "")}
    return out


def _range(default: int, top: int, unit: str) -> Json:
    return {
        "default": f"{default}{unit}",
        "validRange": {"min": f"1{unit}", "max": f"{top}{unit}", "step": f"1{unit}"},
    }


def charged_memory_mib(consumed: Mapping[str, object], where: str) -> int | None:
    """The memory a claim was charged (consumedCapacity.memory), in MiB; None when the
        allocation charges none (a device not shared by capacity). Raises ConfigError
    (a quantity that is not one)."""
    value = consumed.get(MEMORY)
    if value is None:
        return None
    return quantity_mib(value, f"{where}.consumedCapacity.memory")
