"""The one place the agent reads the settings it should serve.

Whoever wants new settings (the config file reloaded, the per-node config manager) puts
them here; each value gets the next generation number. The agent serves the latest value,
whenever it is put (before its backend has opened too), and settles each generation it
tried with its outcome. A caller that wants to report "applied" or "rejected" awaits that
outcome instead of assuming it. A value put while an older one waits is served in its
place; the older one's waiters get the newer one's outcome.
"""

from __future__ import annotations

import asyncio

from gpuslice.config.settings import Settings
from gpuslice.core.errors import GpusliceError

Outcome = asyncio.Future[GpusliceError | None]


class DesiredSettings:
    def __init__(self) -> None:
        self._latest: Settings | None = None
        self._generation = 0
        self._changed = asyncio.Event()
        self._pending: list[tuple[int, Outcome]] = []

    @property
    def latest(self) -> Settings | None:
        return self._latest

    @property
    def generation(self) -> int:
        """How many values were put (0: none yet)."""
        return self._generation

    def put(self, settings: Settings) -> int:
        """Make `settings` the desired value; returns its generation."""
        self._generation += 1
        self._latest = settings
        self._changed.set()
        self._changed = asyncio.Event()
        return self._generation

    async def request(self, settings: Settings) -> None:
        """Put `settings` and wait until the agent tried them. Raises the GpusliceError it
        refused them with (the settings in force are then unchanged)."""
        outcome: Outcome = asyncio.get_running_loop().create_future()
        self._pending.append((self.put(settings), outcome))
        error = await outcome
        if error is not None:
            raise error

    async def newer_than(self, seen: int) -> tuple[int, Settings]:
        """The latest value and its generation, once one newer than `seen` was put."""
        while self._generation <= seen:
            await self._changed.wait()
        assert self._latest is not None
        return self._generation, self._latest

    def settle(self, generation: int, error: GpusliceError | None) -> None:
        """The agent tried `generation`: answer its waiters and those of older ones."""
        keep = []
        for pending in self._pending:
            number, outcome = pending
            if number > generation:
                keep.append(pending)
            elif not outcome.done():
                outcome.set_result(error)
        self._pending = keep
