"""Which health events make a GPU unhealthy, and which devices that touches."""

from __future__ import annotations

from dataclasses import dataclass

from gpuslice.core.devices import HealthEvent

# XIDs upstream ignores by default: application errors, not GPU faults.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class XidPolicy:
    enabled: bool = True
    ignored: frozenset[int] = DEFAULT_IGNORED_XIDS

    def verdict(self, event: HealthEvent) -> bool | None:
        """False: the GPU is unhealthy; True: it recovered; None: no change."""
        if not self.enabled:
            return None
        if event.kind == "lost":
            return False
        if event.kind == "recovered":
            return True
        if event.kind == "xid" and event.xid not in self.ignored:
            return False
        return None


def apply_event(unhealthy: frozenset[str], event: HealthEvent, policy: XidPolicy) -> frozenset[str]:
    """The set of unhealthy physical GPUs after `event`. Every replica and MIG
    device of an unhealthy GPU is unhealthy with it."""
    verdict = policy.verdict(event)
    if verdict is False:
        return unhealthy | {event.gpu_uuid}
    if verdict is True:
        return unhealthy - {event.gpu_uuid}
    return unhealthy
