"""Where a set of GPU instances goes on a GPU: a deterministic search over the placements
the driver reports. Largest profiles first, each at the lowest free start that lets the
rest fit too (a depth-first search, so 2x1g + 2g + 3g puts the 3g at 4, not at 0)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuslice.core.mig import MigProfileSpec, Placement


def placement_order(spec: MigProfileSpec) -> tuple[int, int, str]:
    """Largest first: GPU slices, then memory slices, then the name."""
    size = max((p.size for p in spec.placements), default=0)
    return (-spec.slices, -size, spec.name)


def place(
    wanted: Sequence[MigProfileSpec], taken: Sequence[Placement] = ()
) -> tuple[tuple[MigProfileSpec, Placement], ...] | None:
    """A placement for each of `wanted` that overlaps neither another nor `taken`,
    in placement order; None when there is none."""
    order = sorted(wanted, key=placement_order)
    chosen: list[Placement] = []

    def search(i: int) -> bool:
        if i == len(order):
            return True
        # Of two instances of one profile, the second starts after the first: the same
        # sets of placements are not tried twice.
        after = chosen[-1].start if i and order[i - 1] == order[i] else -1
        for option in sorted(order[i].placements):
            if option.start <= after:
                continue
            if any(option.overlaps(p) for p in (*taken, *chosen)):
                continue
            chosen.append(option)
            if search(i + 1):
                return True
            chosen.pop()
        return False

    return tuple(zip(order, chosen, strict=True)) if search(0) else None
