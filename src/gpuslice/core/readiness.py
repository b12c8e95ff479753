"""Readiness as a list of typed checks: each says whether it lets the node be ready and
what /readyz shows under its name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Check:
    name: str  # its key among /readyz's details
    ok: bool  # False: the node is not ready
    detail: object = None  # what /readyz shows under `name` (JSON); None: nothing


def verdict(checks: Iterable[Check]) -> tuple[bool, dict[str, Any]]:
    """Ready when every check is ok; the details of those that have one, in order."""
    ready, details = True, dict[str, Any]()
    for check in checks:
        ready = ready and check.ok
        if check.detail is not None:
            details[check.name] = check.detail
    return ready, details


def reported(name: str, detail: object) -> Check:
    """A detail reported for `name`, never a reason to be unready."""
    return Check(name, True, detail)
