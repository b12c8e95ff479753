"""DesiredSettings: the one holder of the settings the agent converges to. A value put
before anyone serves is kept for when serving starts; waiters hear the real outcome; a
newer value takes an older waiting one's place."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gpuslice.config.options import resolve_options
from gpuslice.config.settings import Settings, load_settings
from gpuslice.core.errors import HardwareError
from gpuslice.services.desired import DesiredSettings


def named(name: str) -> Settings:
    return dataclasses.replace(load_settings(resolve_options({}, {})), name=name)


async def test_a_value_put_before_anyone_waits_is_there_when_they_do() -> None:
    desired = DesiredSettings()
    assert (desired.latest, desired.generation) == (None, 0)
    desired.put(named("a"))
    async with asyncio.timeout(1):
        generation, settings = await desired.newer_than(0)
    assert (generation, settings.name) == (1, "a")


async def test_request_returns_once_served_and_raises_what_refused_it() -> None:
    desired = DesiredSettings()
    served = asyncio.create_task(desired.request(named("a")))
    generation, _ = await desired.newer_than(0)
    assert not served.done()  # nothing is reported before the agent tried it
    desired.settle(generation, None)
    async with asyncio.timeout(1):
        await served

    refused = asyncio.create_task(desired.request(named("b")))
    generation, _ = await desired.newer_than(generation)
    desired.settle(generation, HardwareError("no GPU can serve b"))
    with pytest.raises(HardwareError, match=r"^no GPU can serve b$"):
        async with asyncio.timeout(1):
            await refused


async def test_a_newer_value_takes_the_place_of_one_not_yet_tried() -> None:
    """The agent serves only the latest; the older one's waiter gets that outcome."""
    desired = DesiredSettings()
    older = asyncio.create_task(desired.request(named("old")))
    newer = asyncio.create_task(desired.request(named("new")))
    generation, settings = await desired.newer_than(1)  # once both were put
    assert (generation, settings.name) == (2, "new")
    desired.settle(generation, None)
    async with asyncio.timeout(1):
        await asyncio.gather(older, newer)
