"""What a DRA checkpoint that was not one (torn, corrupt, a checksum that does not match)
is rebuilt from, and what the rebuild found.

The bad file is set aside (kept for a person to look at) and the agent serves on at once,
from an empty set of prepared claims, rebuilt from two sources:

- the claims whose CDI spec of ours is still in the spec directory (the spec names the
  claim UID) and that the API server still holds allocated to this node's pool for this
  driver: prepared again from the ResourceClaim, as the kubelet's prepare would (their
  pods' memory limits with them);
- what the kubelet sends again: a prepare of a claim prepared before succeeds and
  records it; an unprepare of a claim unknown here succeeds and removes its spec.

The other specs' claims are lost: the API server no longer holds them allocated here (their
pods are gone) or they cannot be prepared again; their specs are removed, and one log line
and one Warning Event on the Node name them. While the API server cannot be read, the
specs found are left in place (their pods may run) and the read is tried again.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Recovery:
    reason: str  # why the checkpoint was not one
    moved_to: str  # where the bad file went
    unverified: set[str]  # UIDs of specs not yet checked against the API server
    recovered: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    waiting: str = ""  # why the API server could not be read yet

    def message(self) -> str:
        """The Node Event's message: one line."""
        return (
            f"{self.reason}; moved to {self.moved_to}; claims prepared again: "
            f"{len(self.recovered)}; lost: {', '.join(self.lost) or 'none'}"
        )

    def status(self) -> dict[str, object]:
        """The readiness detail (never a reason to be unready: the agent serves)."""
        out: dict[str, object] = {"reason": self.reason, "movedTo": self.moved_to}
        if self.unverified:
            out["unverified"] = len(self.unverified)
            out["waiting"] = self.waiting
        out["recovered"] = len(self.recovered)
        out["lost"] = sorted(self.lost)
        return out
