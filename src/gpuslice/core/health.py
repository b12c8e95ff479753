"""Which XIDs count as GPU faults: upstream's skip list, plus what its two env vars
(DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS) add; config.health_env reads them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# XIDs upstream skips by default: application errors, not GPU faults.
DEFAULT_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, slots=True)
class XidPolicy:
    skipped: frozenset[int] = DEFAULT_SKIPPED_XIDS
    forced: frozenset[int] = frozenset()  # always count (DP_ENABLE_HEALTHCHECKS)
    skip_all: bool = False  # DP_DISABLE_HEALTHCHECKS=all
    force_all: bool = False  # DP_ENABLE_HEALTHCHECKS=all
    warnings: tuple[str, ...] = field(default=(), compare=False)  # malformed entries, ignored

    @property
    def watching(self) -> bool:
        """False when XID health checking is off: nothing is watched at all."""
        return not self.skip_all or self.force_all or bool(self.forced)

    def counts(self, xid: int) -> bool:
        """True when this XID marks a device unhealthy."""
        if self.force_all or xid in self.forced:
            return True
        return not self.skip_all and xid not in self.skipped

    def describe(self) -> str:
        """One line for the startup log."""
        if not self.watching:
            return "XID health checks disabled"
        if self.force_all:
            return "every XID counts"
        skipped = "all" if self.skip_all else _join(self.skipped - self.forced)
        forced = f"; always counted: {_join(self.forced)}" if self.forced else ""
        return f"skipped XIDs: {skipped or 'none'}{forced}"


def _join(xids: Iterable[int]) -> str:
    return ",".join(str(x) for x in sorted(xids))
