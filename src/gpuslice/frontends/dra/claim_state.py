"""The DRA driver's prepared claims across restarts: its checkpoint read at start, taken
over once the sockets are ours, swept, set aside and rebuilt when it is not one, and the
memory limits of the claims' pods told to services.isolation.

At start (`restore`), before the sockets are ours, the checkpoint is only read: the
claims prepared before and their pods' limits are known before the first isolation
pass, while a predecessor that still serves may keep writing it. Once the sockets are
ours (`settle`: the predecessor has let go, its checkpoint is final) it is read again;
claims left PrepareStarted (or whose spec an interrupted unprepare removed) are rolled
back and every spec of ours no remaining claim names is removed. A file that is not a
checkpoint is set aside and rebuilt (frontends.dra.recovery); one that cannot be read
now (an I/O error) is not taken for an empty one: calls refuse until it reads again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

import structlog

from gpuslice.core.dra.claim_cdi import spec_claim_uid, spec_file_name
from gpuslice.core.dra.claims import (
    ClaimError,
    ClaimRef,
    ClaimSharing,
    PreparedClaim,
    allocated_here,
)
from gpuslice.core.dra.devices import DraDevice, DraOptions
from gpuslice.core.dra.partitions import Partition
from gpuslice.core.errors import BackendError, BadCheckpoint
from gpuslice.core.ports import ClaimCheckpoint, ClaimSpecs, DraApi
from gpuslice.frontends.dra.recovery import Recovery
from gpuslice.services.claim_shares import ClaimShares

log = structlog.get_logger("gpuslice.dra")
REBUILT = "DraCheckpointRebuilt"  # the reason of the Node's Event


@dataclass(frozen=True, slots=True)
class Planned:
    claim: PreparedClaim  # as recorded PrepareStarted
    text: str  # its CDI spec
    devices: tuple[DraDevice, ...]
    interval: str | None  # a TimeSlicing interval asked for
    sharing: ClaimSharing = field(default_factory=ClaimSharing)
    partitions: tuple[Partition, ...] = ()  # its partitionable MIG devices


class ClaimState:
    """The prepared claims (claim UID ->) and the files that keep them; DraDriver's base."""

    def __init__(
        self,
        *,
        node: str,
        opts: DraOptions,
        api: DraApi,
        checkpoint: ClaimCheckpoint,
        specs: ClaimSpecs,
        shares: ClaimShares | None,
    ) -> None:
        self.node = node
        self.opts = opts
        self.shares = shares
        self._api = api
        self._checkpoint = checkpoint
        self._specs = specs
        self.prepared: dict[str, PreparedClaim] = {}
        self._lock = asyncio.Lock()  # calls and the checkpoint's own steps, one at a time
        self.checkpoint_error = ""  # why the checkpoint could not be read; "" when it was
        self.recovery: Recovery | None = None  # a bad checkpoint set aside and rebuilt
        self.settled = asyncio.Event()  # set once the checkpoint is ours (settle)

    @property
    def driver(self) -> str:
        return self.opts.driver

    async def _plan(self, ref: ClaimRef, obj: dict[str, object], *, recovering: bool = False
                    ) -> Planned:  # fmt: skip
        raise NotImplementedError  # DraDriver's

    async def _rebuilt(self, planned: Planned) -> tuple[PreparedClaim, str]:
        """A claim rebuilt from the API server, completed, and its spec (DraDriver: naming
        its MIG instances as they are, with its MPS daemon). Raises ClaimError."""
        return replace(planned.claim, completed=True), planned.text

    def _claims_known(self) -> None:
        """Told once the prepared claims are known: the checkpoint settled, or claims
        rebuilt from the API server (DraDriver: their MPS daemons)."""

    async def restore(self) -> None:
        """At start, before the sockets are ours: the claims prepared before, and their
        pods' memory limits, known before anything else runs. Nothing is changed on
        disk (a predecessor may still serve); `settle` reads the file again."""
        try:
            self.prepared = await self._checkpoint.load()
        except BackendError:  # a bad or unreadable file: settle() deals with it
            return
        self._tell_shares()

    async def settle(self) -> None:
        """Once the sockets are ours: read the checkpoint again (a predecessor's last
        word), roll back, sweep; a bad file is set aside and rebuilt. Calls wait."""
        async with self._lock:
            await self._load()
        self.settled.set()

    async def read_checkpoint_again(self) -> None:
        """While the checkpoint is unreadable, or claims wait for the API server to be
        checked: try again (between calls)."""
        async with self._lock:
            if self.checkpoint_error:
                await self._load()
            elif self.recovery is not None and self.recovery.unverified:
                await self._recover(self.recovery)

    async def _load(self) -> None:
        try:
            self.prepared = await self._checkpoint.load()
        except BadCheckpoint as exc:
            await self._start_over(str(exc))
            return
        except BackendError as exc:
            if str(exc) != self.checkpoint_error:
                log.error("dra_checkpoint_unreadable", error=str(exc))
            self.checkpoint_error = str(exc)
            return
        if self.checkpoint_error:
            log.info("dra_checkpoint_readable")
        self.checkpoint_error = ""
        if self.prepared:
            log.info("dra_claims_restored", claims=len(self.prepared))
        await self._sweep()
        self._tell_shares()
        self._claims_known()

    async def _start_over(self, why: str) -> None:
        """A file that is not a checkpoint: set it aside, serve on from nothing, and
        rebuild what the API server and the specs left tell (frontends.dra.recovery).
        One that cannot be moved cannot be replaced either: calls refuse meanwhile."""
        try:
            moved = await self._checkpoint.set_aside()
            names = await self._specs.names()
        except BackendError as exc:
            self._unreadable(f"{why}; {exc}")
            return
        self.checkpoint_error = ""
        self.prepared = {}
        specs = {uid for n in names if (uid := spec_claim_uid(self.opts, n)) is not None}
        self.recovery = Recovery(why, moved, specs)
        await self._recover(self.recovery)

    def _unreadable(self, why: str) -> None:
        if why != self.checkpoint_error:
            log.error("dra_checkpoint_unreadable", error=why)
        self.checkpoint_error = why

    async def _recover(self, recovery: Recovery) -> None:
        """Prepare again the claims of the specs found that the API server still holds
        allocated here; the others are lost: their specs go, one line names them."""
        try:
            found = await self._api.claims_on(self.node, self.driver)
        except BackendError as exc:
            if str(exc) != recovery.waiting:
                log.warning("dra_checkpoint_rebuild_waiting", error=str(exc),
                            claims=len(recovery.unverified))  # fmt: skip
            recovery.waiting = str(exc)
            return
        rebuilt: dict[str, tuple[PreparedClaim, str]] = {}
        for obj in found:
            ref = allocated_here(obj, self.driver, self.node)
            if ref is None or ref.uid not in recovery.unverified or ref.uid in self.prepared:
                continue
            try:
                planned = await self._plan(ref, obj, recovering=True)
                rebuilt[ref.uid] = await self._rebuilt(planned)
            except ClaimError as exc:
                log.warning("dra_claim_not_rebuilt", claim=str(ref), uid=ref.uid, error=str(exc))
        try:
            for claim, text in rebuilt.values():
                await self._specs.write(claim.spec, text)
            claims = {u: c for u, (c, _) in rebuilt.items()}
            await self._checkpoint.save({**self.prepared, **claims})
        except BackendError as exc:
            recovery.waiting = str(exc)
            log.warning("dra_checkpoint_rebuild_waiting", error=str(exc))
            return
        self.prepared.update((u, c) for u, (c, _) in rebuilt.items())
        lost = sorted(recovery.unverified - self.prepared.keys())
        recovery.unverified.clear()
        recovery.recovered += sorted(rebuilt)
        recovery.lost, recovery.waiting = lost, ""
        for uid in lost:
            await self._remove_quietly(spec_file_name(self.opts, uid))
        log.error("dra_checkpoint_rebuilt", reason=recovery.reason, moved_to=recovery.moved_to,
                  recovered=",".join(recovery.recovered) or "none",
                  lost=",".join(lost) or "none")  # fmt: skip
        await self._api.node_event(self.node, REBUILT, recovery.message())
        self._tell_shares()
        self._claims_known()

    def _tell_shares(self) -> None:
        """The pods' memory limits of every prepared claim, to services.isolation."""
        if self.shares is not None:
            self.shares.restore(
                {u: (c.pods, dict(c.limits)) for u, c in self.prepared.items() if c.completed}
            )

    async def _sweep(self) -> None:
        """Claims left PrepareStarted are rolled back, and so are claims whose spec is
        gone (an unprepare killed between removing the spec and the entry); specs of
        ours that no remaining claim names are removed."""
        try:
            names = await self._specs.names()
            kept = {
                uid: c
                for uid, c in self.prepared.items()
                if c.completed and (not c.spec or c.spec in names)
            }
            if kept != self.prepared:
                await self._checkpoint.save(kept)
                gone = sorted(set(self.prepared) - set(kept))
                self.prepared = kept
                log.warning("dra_claims_rolled_back", claims=",".join(gone))
            for name in names:
                uid = spec_claim_uid(self.opts, name)
                if uid is not None and uid not in self.prepared:
                    await self._specs.remove(name)
                    log.warning("dra_orphan_spec_removed", spec=name, uid=uid)
        except BackendError as exc:
            log.error("dra_sweep_failed", error=str(exc))

    async def _readable(self) -> str:
        """ "" once the checkpoint was read (again, after it was not); else why not."""
        if self.checkpoint_error:
            await self._load()
        if not self.checkpoint_error:
            return ""
        return (
            f"{self.checkpoint_error}; claims are neither prepared nor unprepared until it "
            "reads again"
        )

    async def _remove_quietly(self, spec: str) -> None:
        try:
            await self._specs.remove(spec)
        except BackendError as exc:
            log.error("dra_spec_not_removed", spec=spec, error=str(exc))
