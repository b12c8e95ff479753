"""The ways a device is served, one module each. A new one is a module and a line in
STRATEGIES; everything else asks the strategy (core.strategies.base), never its name.

The sharing strategies are those with a config block; where several blocks are set, the
one of highest `precedence` is in force (upstream's: mps whenever it is present)."""

from __future__ import annotations

from gpuslice.core.strategies.base import Strategy
from gpuslice.core.strategies.mig import MIG
from gpuslice.core.strategies.mps import MPS
from gpuslice.core.strategies.time_slicing import TIME_SLICING
from gpuslice.core.strategies.whole import WHOLE

STRATEGIES: tuple[Strategy, ...] = (WHOLE, MIG, TIME_SLICING, MPS)

__all__ = ["MIG", "MPS", "STRATEGIES", "TIME_SLICING", "WHOLE", "Strategy"]


def by_name(name: str) -> Strategy:
    """The strategy a sharing plan or resource names (KeyError: none)."""
    for strategy in STRATEGIES:
        if strategy.name == name:
            return strategy
    raise KeyError(name)


def by_dra_name(name: object) -> Strategy | None:
    """The strategy of an opaque DRA config's `sharing.strategy`, None when none is."""
    return next((s for s in STRATEGIES if s.dra_name and s.dra_name == name), None)


def sharing() -> tuple[Strategy, ...]:
    """The strategies with a config block, first the one in force when several are set."""
    return tuple(sorted((s for s in STRATEGIES if s.config_key), key=lambda s: -s.precedence))


def of_device(is_mig: bool) -> Strategy:
    """How a device itself is served, beside the node's sharing: a MIG slice or whole."""
    return MIG if is_mig else WHOLE
