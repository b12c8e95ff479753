"""DraDriver: NodePrepareResources and NodeUnprepareResources, idempotent by claim UID.

Prepare reads the ResourceClaim the kubelet names (the call carries only a reference),
checks its allocation against the devices this node publishes, their health and the
claims already prepared (core.dra.claims), writes the claim's CDI spec, records the claim
in the checkpoint and answers with the devices' CDI IDs. A claim already prepared gets
the same answer again without reading anything. Unprepare removes the spec and the
checkpoint entry; it needs neither the claim nor the devices, so it works after a
restart, for a device gone unhealthy, and for a claim never prepared (a no-op). Calls
are serialised: each changes the prepared set the next one checks against.
A refusal (bad config, device held, device unhealthy) is the claim's error, which the
kubelet shows on the pod.

Crash-safe in two phases: a claim is recorded PrepareStarted before its spec is written
and PrepareCompleted after; unprepare removes the spec before the entry, and an
unprepare of a claim unknown here removes the spec its UID names (one a bad checkpoint
forgot). What happens to the checkpoint across restarts is frontends.dra.claim_state's;
calls wait until it is settled. Each prepared claim records its pods' memory limits
(services.isolation keeps them in force), so they survive a restart with it.

A claim asking for MPS on MIG devices gets its own control daemon (frontends.dra.claim_mps):
started once its instances exist and its spec is written, recorded PrepareCompleted, and
quit at unprepare before its instances are destroyed. At start the completed claims'
daemons are adopted (or started again) and every other claim daemon is quit.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial

import structlog

from gpuslice.core.cdi_toolkit import ToolkitDevices
from gpuslice.core.dra.claim_cdi import claim_spec, claim_spec_name, spec_file_name
from gpuslice.core.dra.claims import (
    ClaimError,
    ClaimRef,
    ClaimSharing,
    PreparedClaim,
    PrepareResult,
    check_devices,
    claim_daemon,
    parse_claim,
    prepared_devices,
    sharing_for,
)
from gpuslice.core.dra.devices import GPU, DraDevice, DraOptions
from gpuslice.core.dra.health import DeviceHealth, health_list
from gpuslice.core.dra.slices import is_unhealthy
from gpuslice.core.errors import BackendError
from gpuslice.core.isolation import Limit
from gpuslice.core.isolation_dra import claim_limits, claim_pods
from gpuslice.core.mps import DaemonPlan, claim_resource
from gpuslice.core.ports import ClaimCheckpoint, ClaimSpecs, DraApi, NodeView, TimeSlicer
from gpuslice.frontends.dra.claim_mps import ClaimDaemons
from gpuslice.frontends.dra.claim_state import ClaimState, Planned
from gpuslice.frontends.dra.dynamic_mig import Key, MigInstances
from gpuslice.services.claim_shares import ClaimShares

log = structlog.get_logger("gpuslice.dra")


class DraDriver(ClaimState):
    """The DraHandler port. `toolkit` holds the NVIDIA Container Toolkit's CDI device names
    found on the node (the front-end looks them up at each step); `control_devices` the
    driver's control nodes present here."""

    def __init__(
        self,
        *,
        node: str,
        opts: DraOptions,
        view: NodeView,
        api: DraApi,
        checkpoint: ClaimCheckpoint,
        specs: ClaimSpecs,
        control_devices: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
        shares: ClaimShares | None = None,  # per-pod memory limits (--memory-isolation)
        time_slicer: TimeSlicer | None = None,
        mig: MigInstances | None = None,  # --dra-dynamic-mig
        mps: ClaimDaemons | None = None,  # the claims' own MPS daemons (MPS on MIG)
    ) -> None:
        super().__init__(
            node=node, opts=opts, api=api, checkpoint=checkpoint, specs=specs, shares=shares
        )
        self._slicer = time_slicer
        self.mig = mig
        self.mps = mps
        self._view = view
        self.toolkit = ToolkitDevices()
        self._control = tuple(control_devices)
        self._clock = clock
        self.devices: dict[str, DraDevice] = {}
        self._health: tuple[DeviceHealth, ...] = ()
        self._since: dict[str, int] = {}  # device -> when its health last changed
        self._bad: dict[str, bool] = {}
        self._health_gen = 0
        self._health_changed = asyncio.Condition()

    async def set_devices(self, devices: Iterable[DraDevice]) -> None:
        """The devices published now (the front-end's step)."""
        self.devices = {d.name: d for d in devices}
        await self.refresh_health()

    # DraHandler

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        out = {}
        await self.settled.wait()
        async with self._lock:
            why = await self._readable()
            for ref in claims:
                out[ref.uid] = self._refused(ref, why) if why else await self._prepare(ref)
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        out = {}
        await self.settled.wait()
        async with self._lock:
            why = await self._readable()
            for ref in claims:
                out[ref.uid] = why or await self._unprepare(ref)
        return out

    def health(self) -> tuple[DeviceHealth, ...]:
        return self._health

    @property
    def health_generation(self) -> int:
        return self._health_gen

    async def wait_health_changed(self, seen: int) -> int:
        async with self._health_changed:
            await self._health_changed.wait_for(lambda: self._health_gen != seen)
        return self._health_gen

    async def refresh_health(self) -> None:
        """Recompute the health list from the node's unhealthy set (each unhealthy device's
        message names who holds it: health, mps, watchdog, ...); wake the streams when it
        changed."""
        unhealthy = self._view.unhealthy
        now = int(self._clock())
        for device in self.devices.values():
            bad = is_unhealthy(device, unhealthy)
            if self._bad.get(device.name) != bad:
                self._bad[device.name] = bad
                self._since[device.name] = now
        holders: dict[str, list[str]] = {}
        for holder, held in sorted(self._view.held.items()):
            for uuid in held:
                holders.setdefault(uuid, []).append(holder)
        reasons = {uuid: "held unhealthy by " + ", ".join(h) for uuid, h in holders.items()}
        listed = health_list(
            self.devices.values(), unhealthy, pool=self.node, since=self._since, reasons=reasons
        )
        if listed != self._health:
            self._health = listed
            async with self._health_changed:
                self._health_gen += 1
                self._health_changed.notify_all()

    # the work

    async def _prepare(self, ref: ClaimRef) -> PrepareResult:
        done = self.prepared.get(ref.uid)
        if done is not None and done.completed:
            return PrepareResult(done.devices)
        started = time.monotonic()
        try:
            obj = await self._api.get_claim(ref.namespace, ref.name)
        except BackendError as exc:
            return self._refused(ref, f"claim {ref}: cannot read it: {exc}")
        try:
            planned = await self._plan(ref, obj)
        except ClaimError as exc:
            return self._refused(ref, str(exc))
        claim, spec = planned.claim, planned.claim.spec
        daemon: DaemonPlan | None = None
        try:  # PrepareStarted only marks the spec (and the MIG instances) as ours should the
            # agent be killed: a node crash losing it loses nothing (the spec is an orphan,
            # swept; MIG instances do not survive a reboot), and a torn file is rebuilt;
            # PrepareCompleted, which the answer depends on, is durable
            await self._record(claim, durable=False)
            text, devices = planned.text, planned.devices
            if planned.partitions:
                devices = await self._create_instances(planned)
                text = self._spec_text(ref.uid, devices, planned.sharing)
            if spec:
                await self._specs.write(spec, text)
            await self._apply_interval(planned.devices, planned.interval)
            if self.mps is not None:
                daemon = claim_daemon(ref.uid, planned.sharing, devices, self.mps.mps_root)
                if daemon is not None:
                    await self.mps.start(daemon)
            await self._record(replace(claim, completed=True, daemon=daemon))
        except BackendError as exc:
            await self._roll_back(ref.uid, spec, claim.instances, daemon)
            return self._refused(ref, f"claim {ref}: {exc}")
        if self.recovery is not None:
            self.recovery.unverified.discard(ref.uid)
        if self.shares is not None:  # the pods' memory limits follow (services.isolation)
            self.shares.put(ref.uid, claim.pods, dict(claim.limits))
        log.info("dra_claim_prepared", claim=str(ref), uid=ref.uid,
                 devices=",".join(d.device for d in claim.devices),
                 ms=round((time.monotonic() - started) * 1000, 1))  # fmt: skip
        return PrepareResult(claim.devices)

    async def _plan(self, ref: ClaimRef, obj: dict[str, object], *, recovering: bool = False
                    ) -> Planned:  # fmt: skip
        """The claim as it is to be recorded (PrepareStarted), its spec's text and
        what its devices need. Raises ClaimError. `recovering`: a claim prepared
        before (its devices' health is not asked again: its pods run)."""
        settings = self._view.settings
        claim = await asyncio.to_thread(parse_claim, obj, ref, self.driver)
        devices = check_devices(
            claim,
            self.devices,
            pool=self.node,
            unhealthy=() if recovering else self._view.unhealthy,
            prepared=self.prepared,
        )
        sharing = sharing_for(claim, devices, mps_root=settings.allocate.mps_root,
                              claims_root=self.mps.mps_root if self.mps else "")  # fmt: skip
        result = prepared_devices(claim, devices, self.opts, self.toolkit)
        text = self._spec_text(ref.uid, devices, sharing)
        pods: tuple[str, ...] = ()
        limits: dict[str, Limit] = {}
        if self.shares is not None:
            pods = claim_pods(obj)
            limits = claim_limits(obj, claim, devices, self._view.snapshot, settings.memory,
                                  self.driver)  # fmt: skip
        spec = spec_file_name(self.opts, ref.uid) if devices else ""
        parts = self.mig.now.by_name if self.mig is not None else {}
        mine = tuple(parts[d.name] for d in devices if d.name in parts)
        instances = tuple(
            (p.device.gpu_uuid, p.profile, p.placement.start) for p in mine if p.placement
        )
        limited = tuple(sorted(limits.items()))
        recorded = PreparedClaim(
            ref, result, spec, completed=False, pods=pods, limits=limited, instances=instances
        )
        return Planned(recorded, text, tuple(devices), sharing.interval, sharing, mine)

    def _spec_text(self, uid: str, devices: Sequence[DraDevice], sharing: ClaimSharing) -> str:
        settings = self._view.settings
        mps_root = settings.allocate.mps_root
        if sharing.own_daemon and self.mps is not None:
            mps_root = self.mps.mps_root  # the claim's own daemon's
        return claim_spec(
            uid,
            devices,
            sharing,
            self.opts,
            mps_root=mps_root,
            dev_root=settings.allocate.dev_root,
            control_devices=self._control,
        )

    async def _rebuilt(self, planned: Planned) -> tuple[PreparedClaim, str]:
        """A claim rebuilt from the API server: its spec names its MIG instances as they
        are (a partition whose instance is gone is not rebuilt), and its MPS daemon is
        recorded as prepare would have (`_claims_known` then adopts or starts it)."""
        claim, text, concrete = planned.claim, planned.text, list(planned.devices)
        if planned.partitions and self.mig is not None:
            by_name = {p.device.name: p for p in planned.partitions}
            concrete = []
            for device in planned.devices:
                part = by_name.get(device.name)
                try:
                    found = device if part is None else await self.mig.find(part)
                except BackendError as exc:
                    raise ClaimError(f"claim {claim.ref}: {exc}") from None
                if found is None:
                    raise ClaimError(f"claim {claim.ref}: no MIG instance at {device.name}")
                concrete.append(found)
            text = self._spec_text(claim.ref.uid, concrete, planned.sharing)
        daemon = None
        if self.mps is not None:
            daemon = claim_daemon(claim.ref.uid, planned.sharing, concrete, self.mps.mps_root)
        return replace(claim, completed=True, daemon=daemon), text

    def _claims_known(self) -> None:
        """The completed claims' MPS daemons adopted or started again; every other claim
        daemon quit once idle."""
        if self.mps is not None:
            self.mps.restore(self._daemons(self.mps.mps_root))

    async def _create_instances(self, planned: Planned) -> tuple[DraDevice, ...]:
        """The claim's MIG instances made at their placements: its devices as they are
        then. Raises BackendError."""
        assert self.mig is not None
        by_name = {p.device.name: p for p in planned.partitions}
        concrete = []
        for device in planned.devices:
            part = by_name.get(device.name)
            concrete.append(device if part is None else await self.mig.create(part))
        return tuple(concrete)

    async def _apply_interval(self, devices: Sequence[DraDevice], interval: str | None) -> None:
        """A TimeSlicing config's interval set on the claim's GPUs (a MIG device's parent
        is left alone: MIG devices do not time-slice with each other)."""
        if interval is None or self._slicer is None:
            return
        slicer = self._slicer
        for uuid in dict.fromkeys(d.gpu_uuid for d in devices if d.kind == GPU):
            await self._view.call(partial(slicer.set_time_slice, uuid, interval))
            log.info("dra_time_slice_set", gpu=uuid, interval=interval)

    async def _record(self, claim: PreparedClaim, *, durable: bool = True) -> None:
        """The claim in the checkpoint (on disk first, then here). Raises BackendError."""
        await self._checkpoint.save({**self.prepared, claim.ref.uid: claim}, durable=durable)
        self.prepared[claim.ref.uid] = claim

    async def _roll_back(
        self, uid: str, spec: str, instances: Sequence[Key] = (), daemon: DaemonPlan | None = None
    ) -> None:
        if daemon is not None and self.mps is not None:
            try:
                await self.mps.stop(daemon.root)
            except BackendError as exc:  # quit by its supervisor once idle
                log.error("dra_mps_daemon_not_stopped", uid=uid, error=str(exc))
        if spec:
            await self._remove_quietly(spec)
        if instances and self.mig is not None:
            try:
                await self.mig.destroy(instances)
            except BackendError as exc:  # left PrepareStarted: the next start sweeps them
                log.error("dra_mig_not_destroyed", uid=uid, error=str(exc))
                return
        if uid in self.prepared:
            remaining = {u: c for u, c in self.prepared.items() if u != uid}
            try:
                await self._checkpoint.save(remaining)
                self.prepared = remaining
            except BackendError as exc:  # left PrepareStarted: the next start rolls it back
                log.error("dra_checkpoint_not_written", uid=uid, error=str(exc))

    async def _unprepare(self, ref: ClaimRef) -> str:
        done = self.prepared.get(ref.uid)
        if done is None:  # never prepared, or forgotten with a bad checkpoint: its spec goes
            name = claim_spec_name(self.opts, ref.uid)
            try:
                if name is not None:
                    await self._specs.remove(name)
            except BackendError as exc:
                return f"claim {ref}: {exc}"
            if self.recovery is not None:
                self.recovery.unverified.discard(ref.uid)
            return ""
        try:
            if done.daemon is not None and self.mps is not None:
                await self.mps.stop(done.daemon.root)  # before its instances go
            if done.instances and self.mig is not None:
                await self.mig.destroy(done.instances)
            if done.spec:
                await self._specs.remove(done.spec)
            remaining = {uid: c for uid, c in self.prepared.items() if uid != ref.uid}
            await self._checkpoint.save(remaining)
        except BackendError as exc:
            log.error("dra_unprepare_failed", claim=str(done.ref), uid=ref.uid, error=str(exc))
            return f"claim {done.ref}: {exc}"
        self.prepared = remaining
        if self.shares is not None:
            self.shares.drop(ref.uid)
        log.info("dra_claim_unprepared", claim=str(done.ref), uid=ref.uid)
        return ""

    async def _sweep(self) -> None:
        """The claims' and specs' sweep, then (--dra-dynamic-mig) every MIG instance on
        the partitioned GPUs that no completed claim owns is destroyed."""
        await super()._sweep()
        if self.mig is None:
            return
        keep = [k for c in self.prepared.values() if c.completed for k in c.instances]
        try:
            await self.mig.sweep(keep)
        except BackendError as exc:
            log.error("dra_mig_sweep_failed", error=str(exc))

    def _daemons(self, mps_root: str) -> list[DaemonPlan]:
        """The completed claims' daemons, each where its claim's belongs (a checkpoint
        naming another directory is not followed)."""
        out = []
        for uid, claim in self.prepared.items():
            daemon = claim.daemon
            if daemon is None or not claim.completed:
                continue
            if daemon.root != posixpath.join(mps_root, claim_resource(uid)):
                log.error("dra_mps_daemon_not_restored", uid=uid, root=daemon.root)
                continue
            out.append(daemon)
        return out

    def _refused(self, ref: ClaimRef, why: str) -> PrepareResult:
        log.warning("dra_claim_refused", claim=str(ref), uid=ref.uid, error=why)
        return PrepareResult(error=why)
