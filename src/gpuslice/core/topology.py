"""NVLink-aware choice of whole GPUs, from link counts computed once per snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from math import comb

from gpuslice.core.devices import HardwareSnapshot

# Above this many candidate sets the search turns greedy instead of exhaustive.
EXHAUSTIVE_LIMIT = 5000


@dataclass(frozen=True, slots=True)
class Topology:
    """Pairwise NVLink counts between GPUs (by UUID); missing pairs have none."""

    links: dict[frozenset[str], int] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # UUID -> GPU index

    @classmethod
    def from_snapshot(cls, snapshot: HardwareSnapshot) -> Topology:
        links: dict[frozenset[str], int] = {}
        for gpu in snapshot.gpus:
            for peer, count in gpu.nvlinks:
                if peer != gpu.uuid:
                    pair = frozenset((gpu.uuid, peer))
                    links[pair] = max(links.get(pair, 0), count)
        return cls(links=links, order={g.uuid: g.index for g in snapshot.gpus})

    def score(self, a: str, b: str) -> int:
        return self.links.get(frozenset((a, b)), 0)

    def best_set(self, available: Sequence[str], required: Sequence[str], size: int) -> list[str]:
        """The `size` GPUs (all of `required` among them) with the most links
        inside the set and, on a tie, the fewest links cut to the GPUs left
        over, so the remaining GPUs stay well connected. Deterministic."""
        rest = sorted(
            (a for a in available if a not in set(required)), key=lambda u: self.order.get(u, 0)
        )
        needed = size - len(required)
        if needed <= 0:
            return list(required)
        if not self.links or len(rest) == needed:
            return [*required, *rest[:needed]]
        if comb(len(rest), needed) > EXHAUSTIVE_LIMIT:
            return self._greedy(rest, list(required), needed)
        best: tuple[int, int] | None = None
        chosen: tuple[str, ...] = ()
        for combo in combinations(rest, needed):
            picked = (*required, *combo)
            inside = sum(self.score(a, b) for a, b in combinations(picked, 2))
            left = [u for u in rest if u not in combo]
            cut = sum(self.score(a, b) for a in picked for b in left)
            key = (inside, -cut)
            if best is None or key > best:
                best, chosen = key, combo
        return [*required, *chosen]

    def _greedy(self, rest: list[str], picked: list[str], needed: int) -> list[str]:
        pool = list(rest)
        for _ in range(needed):
            nxt = max(pool, key=lambda u: (sum(self.score(u, p) for p in picked), -pool.index(u)))
            picked.append(nxt)
            pool.remove(nxt)
        return picked
