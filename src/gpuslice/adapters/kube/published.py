"""What the agent last published as its NodeFeature, so an unchanged one is not read back.

Only this agent writes its NodeFeature, so while the labels it wants are the ones it
wrote, reading the object again finds them there. A slow, jittered re-check (someone
edited or deleted it) reads it anyway; a failed write forgets what was held.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

from gpuslice.adapters.kube import objects


class Published:
    """Labels held per key, each until its re-check is due (`clock` seconds, the next
    re-check `every()` seconds after a write or read)."""

    def __init__(self, clock: Callable[[], float], every: Callable[[], float]) -> None:
        self._clock = clock
        self._every = every
        self._held: dict[Hashable, tuple[dict[str, str], float]] = {}

    def holds(self, key: Hashable, labels: Mapping[str, str]) -> bool:
        """Whether `labels` are known to be in place (as objects.holds compares them)."""
        held = self._held.get(key)
        if held is None or self._clock() >= held[1]:
            return False
        return objects.holds({"spec": {"labels": held[0]}}, labels)

    def hold(self, key: Hashable, labels: Mapping[str, str]) -> None:
        self._held[key] = (dict(labels), self._clock() + self._every())

    def forget(self, key: Hashable) -> None:
        self._held.pop(key, None)
