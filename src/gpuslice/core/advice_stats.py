"""Sample distributions for right-sizing: a count of each value, bounded in memory.

Values are counted exactly while there are at most MAX_EXACT distinct ones; past that
they are folded into buckets of relative width PRECISION, each counted at its upper
bound, so a quantile read from them is at most PRECISION above the exact one (never
below: advice from it errs towards more memory). The maximum is always exact. NaN and
infinities are not values: they are counted apart, for the advice to say so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

MAX_EXACT = 4096
PRECISION = 1 / 1024
_LOG_BASE = math.log1p(PRECISION)


class Distribution:
    def __init__(self) -> None:
        self._counts: dict[float, int] = {}
        self._bucketed = False
        self.count = 0
        self.not_finite = 0
        self.max = -math.inf

    @property
    def exact(self) -> bool:
        return not self._bucketed

    def add(self, value: float, times: int = 1) -> None:
        if not math.isfinite(value):
            self.not_finite += times
            return
        self.count += times
        self.max = max(self.max, value)
        key = _bucket(value) if self._bucketed else value
        self._counts[key] = self._counts.get(key, 0) + times
        if not self._bucketed and len(self._counts) > MAX_EXACT:
            self._fold()

    def add_counts(self, counts: Mapping[float, int] | Iterable[tuple[float, int]]) -> None:
        for value, times in counts.items() if isinstance(counts, Mapping) else counts:
            self.add(value, times)

    def merge(self, other: Distribution) -> None:
        before = self.max
        if other._bucketed and not self._bucketed:
            self._fold()
        self.not_finite += other.not_finite
        self.add_counts(other._counts)
        self.max = max(before, other.max)  # a bucket's bound may sit above its values

    def quantile(self, q: float) -> float | None:
        """The nearest-rank q-quantile (the smallest value with at least q of the
        samples at or below it); None without samples."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for value in sorted(self._counts):
            seen += self._counts[value]
            if seen >= rank:
                return min(value, self.max)
        return self.max

    def _fold(self) -> None:
        folded: dict[float, int] = {}
        for value, times in self._counts.items():
            key = _bucket(value)
            folded[key] = folded.get(key, 0) + times
        self._counts, self._bucketed = folded, True


def _bucket(value: float) -> float:
    """The upper bound of the bucket holding `value` (0 and below are their own)."""
    if value <= 0:
        return value
    return math.exp(math.ceil(math.log(value) / _LOG_BASE) * _LOG_BASE)
