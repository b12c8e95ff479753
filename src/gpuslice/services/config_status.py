"""What the config manager says about itself, kept apart from how it follows the config:
the readiness detail (ConfigStatus), the last refusal, the Events already recorded, and
the count of finished reads that tests and `status` wait on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConfigStatus:
    """The readiness detail: the config in force and whether the wanted one was accepted."""

    config: str | None  # the entry in force, "(empty)" for the empty config; None before start
    ok: bool  # False before start, while a newer config is rejected, and while `source` is set
    detail: str
    source: str | None = None  # why the source cannot be followed now (the last read serves)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"config": self.config, "ok": self.ok, "detail": self.detail}
        if self.source is not None:
            out["source"] = self.source
        return out


class Standing:
    """The manager's standing: its status, why the last read was refused (until one is
    not), the last refusal recorded as an Event, and how many reads have finished."""

    def __init__(self, first_detail: str) -> None:
        self.status = ConfigStatus(None, False, first_detail)
        self.rejected: str | None = None
        self._reported = ""
        self._checks = 0
        self._checked = asyncio.Condition()

    def waiting(self, config: str | None, detail: str) -> None:
        """Not ok for now (a config being applied, none in force), refusing nothing."""
        self.status = ConfigStatus(config, False, detail)

    def accepted(self, shown: str, reason: str) -> None:
        self.status = ConfigStatus(shown, True, reason)
        self.rejected = None
        self._reported = ""

    def refused(self, serving: str | None, message: str) -> None:
        self.status = ConfigStatus(serving, False, message)
        self.rejected = message

    def first_report(self, message: str) -> bool:
        """True the first time `message` is reported in a row (one Event per refusal)."""
        if message == self._reported:
            return False
        self._reported = message
        return True

    @property
    def checks(self) -> int:
        return self._checks

    async def checked(self) -> None:
        async with self._checked:
            self._checks += 1
            self._checked.notify_all()

    async def wait_checked(self, seen: int) -> int:
        async with self._checked:
            await self._checked.wait_for(lambda: self._checks != seen)
            return self._checks
