"""Which XIDs count as GPU faults: upstream's skip list and its two env vars.

DP_DISABLE_HEALTHCHECKS adds a comma list of XIDs to the skipped set; "all" or
"xids" as any entry turns XID health checking off. DP_ENABLE_HEALTHCHECKS names
XIDs that always count, over the defaults and the disables; "all" makes every XID
count. Entries are trimmed and case-insensitive; malformed ones are ignored and
reported in `warnings`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DISABLE_ENV = "DP_DISABLE_HEALTHCHECKS"
ENABLE_ENV = "DP_ENABLE_HEALTHCHECKS"

# XIDs upstream skips by default: application errors, not GPU faults.
DEFAULT_SKIPPED_XIDS = frozenset({13, 31, 43, 45, 68, 109})

_ALL = frozenset({"all", "xids"})
_DIGITS = re.compile(r"[0-9]+")
_MAX_XID = 2**64 - 1  # upstream parses entries as unsigned 64-bit integers


@dataclass(frozen=True, slots=True)
class XidPolicy:
    skipped: frozenset[int] = DEFAULT_SKIPPED_XIDS
    forced: frozenset[int] = frozenset()  # always count (DP_ENABLE_HEALTHCHECKS)
    skip_all: bool = False  # DP_DISABLE_HEALTHCHECKS=all
    force_all: bool = False  # DP_ENABLE_HEALTHCHECKS=all
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> XidPolicy:
        skip_all, skipped, skip_warnings = _xid_list(DISABLE_ENV, env.get(DISABLE_ENV, ""))
        force_all, forced, force_warnings = _xid_list(ENABLE_ENV, env.get(ENABLE_ENV, ""))
        return cls(
            skipped=DEFAULT_SKIPPED_XIDS | skipped,
            forced=forced,
            skip_all=skip_all,
            force_all=force_all,
            warnings=skip_warnings + force_warnings,
        )

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


def _xid_list(name: str, value: str) -> tuple[bool, frozenset[int], tuple[str, ...]]:
    """(everything, XIDs, warnings) for one env var. Any "all"/"xids" entry means
    everything. "0" is upstream's own marker for everything, so it means that too."""
    xids: set[int] = set()
    warnings: list[str] = []
    for raw in value.lower().split(","):
        entry = raw.strip()
        if entry in _ALL:
            return True, frozenset(), tuple(warnings)
        if not entry:
            continue
        if not _DIGITS.fullmatch(entry) or int(entry) > _MAX_XID:
            warnings.append(f"{name}: ignoring {entry!r}: not an XID number, 'all' or 'xids'")
            continue
        if int(entry) == 0:
            warnings.append(f"{name}: XID 0 does not exist; read as 'all', as upstream does")
            return True, frozenset(), tuple(warnings)
        xids.add(int(entry))
    return False, frozenset(xids), tuple(warnings)


def _join(xids: Iterable[int]) -> str:
    return ",".join(str(x) for x in sorted(xids))
