"""The scheduler's accounting of consumable capacity (KEP-5075), modelled for tests: what
a claim is charged on a device published with `allowMultipleAllocations`, and whether it
fits beside the claims already there. Written from the API's documented rules, so a test
can check the slices the agent publishes against the scheduler, not only against the
agent's own idea of them:

- a capacity the request names is charged the amount asked, adjusted by the capacity's
  request policy: with `validRange`, an amount below `min` counts as `min`, one between
  steps is rounded up to the next `min + n*step`, and one above `max` (after rounding)
  makes the device unusable for the request; with `validValues` (ascending), the
  smallest value at least the amount, none such: unusable; without a policy, as asked;
- a capacity the request does not name is charged the policy's `default`, and the
  capacity's whole value when it has no policy: the claim then takes the device alone;
- a device fits when, for every capacity, what the claims already there were charged
  plus this claim's charge is at most the capacity's value; a device without
  `allowMultipleAllocations` takes one claim.

Quantities are whole numbers with the API's suffixes (Ki, Mi, Gi, Ti, k, M, G, T).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip


def quantity(text: object) -> int:
    found = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(text).strip())
    if not found:
        raise ValueError(f"not a whole quantity: {text!r}")
    return int(found[1]) * _UNITS[found[2] or ""]


def charge(capacity: Mapping[str, Any], asked: object | None) -> int | None:
    """What one capacity entry ({value, requestPolicy}) charges a request asking `asked`
    (None: not named); None when the request cannot be served by it."""
    value = quantity(capacity["value"])
    policy = capacity.get("requestPolicy")
    if asked is None:
        if policy is None or policy.get("default") is None:
            return value
        return quantity(policy["default"])
    amount = quantity(asked)
    if policy is None:
        return amount
    if "validValues" in policy:
        fitting = [v for v in map(quantity, policy["validValues"]) if v >= amount]
        return min(fitting) if fitting else None
    bounds = policy.get("validRange")
    if bounds is None:
        return amount
    low = quantity(bounds["min"])
    amount = max(amount, low)
    if bounds.get("step") is not None:
        step = quantity(bounds["step"])
        amount = low + -(-(amount - low) // step) * step
    if bounds.get("max") is not None and amount > quantity(bounds["max"]):
        return None
    return amount


@dataclass
class Device:
    """One published device and what its claims were charged."""

    entry: Mapping[str, Any]
    claims: int = 0
    used: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.entry["name"])

    def take(self, asked: Mapping[str, object]) -> dict[str, int] | None:
        """Charge a claim asking `asked` (capacity -> amount) if it fits; its charge."""
        shared = self.entry.get("allowMultipleAllocations") is True
        if self.claims and not shared:
            return None
        capacities = self.entry.get("capacity", {})
        if any(name not in capacities for name in asked):
            return None
        charged: dict[str, int] = {}
        if shared:
            for name, cap in capacities.items():
                amount = charge(cap, asked.get(name))
                if amount is None or self.used.get(name, 0) + amount > quantity(cap["value"]):
                    return None
                charged[name] = amount
        for name, amount in charged.items():
            self.used[name] = self.used.get(name, 0) + amount
        self.claims += 1
        return charged


def allocate(
    entries: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, object]]
) -> list[tuple[str, dict[str, int]] | None]:
    """Each claim (its capacity requests) in turn on the first device it fits: the
    device's name and the claim's charge, or None where it fits nowhere (Pending)."""
    devices = [Device(e) for e in entries]
    out: list[tuple[str, dict[str, int]] | None] = []
    for asked in claims:
        placed = None
        for device in devices:
            charged = device.take(asked)
            if charged is not None:
                placed = (device.name, charged)
                break
        out.append(placed)
    return out
