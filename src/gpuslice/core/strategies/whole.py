"""A whole device to one container: no sharing."""

from __future__ import annotations

from gpuslice.core.strategies.base import Strategy


class Whole(Strategy):
    name = "none"


WHOLE = Whole()
