"""Per-device health marks and their recovery: a state machine with no clock.

Each unhealthy physical device (GPU or MIG UUID) holds a Reason: what marked it
and when. A fatal mark stays until the agent restarts (after the GPU is reset).
A transient mark is re-probed once its hold-down has passed and cleared when the
probe answers normally, or at once by a "recovered" event from the backend. A
device that already recovered `max_flaps` times within `flap_window_s` is held
at its next mark until the agent restarts. Times are seconds on any monotonic
clock, passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

FATAL = "fatal"
TRANSIENT = "transient"

# Causes of a mark.
XID = "xid"
LOST = "lost"  # the backend reported the GPU unreachable
WAIT_FAILED = "wait-failed"  # the event wait itself failed: no device can be vouched for

# XIDs after which NVIDIA's XID catalogue asks for a GPU reset (or a reboot):
# a probe that answers does not prove these devices good again.
FATAL_XIDS = frozenset(
    {
        48,  # double-bit ECC error
        62,  # internal micro-controller halt
        64,  # ECC page retirement / row remapping failure
        74,  # NVLink error
        79,  # GPU has fallen off the bus
        92,  # high single-bit ECC error rate
        95,  # uncontained ECC error
        119,  # GSP RPC timeout
        120,  # GSP error
        140,  # unrecovered ECC error
    }
)


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    holddown_s: float | None = 30.0  # None: transient marks are never re-probed
    max_flaps: int = 3  # recoveries allowed within the window before a hold
    flap_window_s: float | None = 600.0  # None: recoveries count forever
    fatal_xids: frozenset[int] = FATAL_XIDS

    def severity(self, cause: str, xid: int) -> str:
        return FATAL if cause == XID and xid in self.fatal_xids else TRANSIENT


@dataclass(frozen=True, slots=True)
class Reason:
    """Why one device is unhealthy."""

    cause: str  # XID, LOST or WAIT_FAILED
    xid: int  # the XID of the latest marking event; 0 for other causes
    severity: str  # FATAL or TRANSIENT
    since: float  # first mark of this episode
    last: float  # latest event that marked it
    probe_at: float | None  # next re-probe; None when never (held, or no hold-down)
    flapping: bool = False  # held by the flap cap
    detail: str = ""

    @property
    def held(self) -> bool:
        """True when only an agent restart (after a GPU reset) clears it."""
        return self.severity == FATAL or self.flapping


@dataclass(frozen=True, slots=True)
class Change:
    """One transition, for the log. `reason` is the mark now (marked, escalated,
    kept) or the mark just cleared (recovered)."""

    device: str
    action: str  # "marked", "escalated", "recovered", "kept"
    reason: Reason
    via: str = ""  # recovered: "probe" or "event"; kept: why it was not cleared


class HealthBook:
    def __init__(self, policy: RecoveryPolicy | None = None) -> None:
        self.policy = policy or RecoveryPolicy()
        self._marks: dict[str, Reason] = {}
        self._recoveries: dict[str, list[float]] = {}

    @property
    def unhealthy(self) -> frozenset[str]:
        return frozenset(self._marks)

    @property
    def reasons(self) -> dict[str, Reason]:
        """A copy: device -> why it is unhealthy."""
        return dict(self._marks)

    def mark(
        self, devices: Iterable[str], *, cause: str, now: float, xid: int = 0, detail: str = ""
    ) -> list[Change]:
        """Mark devices unhealthy. A repeat re-arms a transient mark's hold-down;
        a fatal mark is never weakened."""
        severity = self.policy.severity(cause, xid)
        new = Reason(cause, xid, severity, now, now, None, detail=detail)
        changes: list[Change] = []
        for device in sorted(set(devices)):
            old = self._marks.get(device)
            if old is None:
                reason = self._arm(replace(new, flapping=self._flapping(device, now)), now)
                changes.append(Change(device, "marked", reason))
            elif old.severity == FATAL and severity == TRANSIENT:
                reason = replace(old, last=now)
            elif old.severity == TRANSIENT and severity == FATAL:
                reason = replace(new, since=old.since)
                changes.append(Change(device, "escalated", reason))
            else:  # the same severity again: the latest cause, the same episode
                reason = self._arm(replace(new, since=old.since, flapping=old.flapping), now)
            self._marks[device] = reason
        return changes

    def clear(self, devices: Iterable[str], *, now: float) -> list[Change]:
        """The backend says these devices answer normally again: clear transient marks."""
        changes: list[Change] = []
        for device in sorted(set(devices)):
            reason = self._marks.get(device)
            if reason is None:
                continue
            if reason.held:
                why = "flapping" if reason.flapping else "fatal"
                changes.append(Change(device, "kept", reason, via=why))
                continue
            changes.append(self._recover(device, reason, now, "event"))
        return changes

    def due(self, now: float) -> list[tuple[str, Reason]]:
        """Marks whose re-probe time has come, with the mark as it is now."""
        return sorted(
            (d, r) for d, r in self._marks.items() if r.probe_at is not None and r.probe_at <= now
        )

    def next_probe_at(self) -> float | None:
        times = [r.probe_at for r in self._marks.values() if r.probe_at is not None]
        return min(times) if times else None

    def probed(self, device: str, seen: Reason, ok: bool, *, now: float) -> list[Change]:
        """The result of probing `device` while its mark was `seen`. A mark that
        changed meanwhile (a new event) ignores the result."""
        if self._marks.get(device) != seen or seen.probe_at is None:
            return []
        if ok:
            return [self._recover(device, seen, now, "probe")]
        self._marks[device] = self._arm(seen, now)
        return []

    def forget(self, keep: Iterable[str]) -> list[str]:
        """Drop marks of devices no longer on the node; returns the dropped ones."""
        wanted = set(keep)
        gone = sorted(d for d in self._marks if d not in wanted)
        for device in gone:
            del self._marks[device]
        return gone

    def _arm(self, reason: Reason, now: float) -> Reason:
        holddown = self.policy.holddown_s
        due = None if reason.held or holddown is None else now + holddown
        return replace(reason, probe_at=due)

    def _recent(self, device: str, now: float) -> list[float]:
        window = self.policy.flap_window_s
        times = self._recoveries.get(device, [])
        if window is not None:
            times = [t for t in times if t > now - window]
        self._recoveries[device] = times
        return times

    def _flapping(self, device: str, now: float) -> bool:
        return len(self._recent(device, now)) >= self.policy.max_flaps

    def _recover(self, device: str, reason: Reason, now: float, via: str) -> Change:
        del self._marks[device]
        self._recent(device, now).append(now)
        return Change(device, "recovered", reason, via=via)
