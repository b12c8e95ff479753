"""Which pods hold how much GPU memory through DRA claims, as the DRA front-end tells it
(services.isolation keeps their cgroups' limits in force). The front-end keeps them in its
checkpoint too, and tells them again after a restart, before the first isolation pass."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuslice.core.isolation import Limit


class ClaimShares:
    """Which pods hold which memory through DRA claims: the DRA front-end tells it on
    prepare and unprepare (it learns the pods from the claim's reservedFor)."""

    def __init__(self) -> None:
        self._claims: dict[str, tuple[tuple[str, ...], dict[str, Limit]]] = {}
        self.changed: Callable[[], None] | None = None

    def put(self, claim_uid: str, pods: tuple[str, ...], limits: Mapping[str, Limit]) -> None:
        self._claims[claim_uid] = (pods, dict(limits))
        if self.changed is not None:
            self.changed()

    def restore(self, claims: Mapping[str, tuple[tuple[str, ...], Mapping[str, Limit]]]) -> None:
        """Every claim's pods and limits at once (the checkpoint read again after a
        restart): what was told before is replaced."""
        self._claims = {uid: (pods, dict(limits)) for uid, (pods, limits) in claims.items()}
        if self.changed is not None:
            self.changed()

    def drop(self, claim_uid: str) -> None:
        if self._claims.pop(claim_uid, None) is not None and self.changed is not None:
            self.changed()

    def by_pod(self) -> dict[str, dict[str, Limit]]:
        out: dict[str, dict[str, Limit]] = {}
        for pods, limits in self._claims.values():
            for uid in pods:
                mine = out.setdefault(uid, {})
                for gpu, limit in limits.items():
                    mine[gpu] = mine[gpu] + limit if gpu in mine else limit
        return out
