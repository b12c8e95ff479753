"""Holds back devices whose hardware a running container still holds in another form
(core.holds), from the kubelet's PodResources List.

The agent checks before it serves each config (so a GPU that moves is held from its
first listing under the new resource) and then every few seconds, which also releases
a hold soon after its container ends. When PodResources cannot be read, the devices in
use as last read stay in force (holds are kept, none released) and serving goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.holds import InUse, held, in_use
from gpuslice.core.ports import PodResources
from gpuslice.core.resources import Resource

log = structlog.get_logger("gpuslice.holds")

INTERVAL_S = 5.0  # one List on a unix socket: about a millisecond of CPU
Serving = Callable[[], tuple[HardwareSnapshot, Sequence[Resource]]]


class DeviceHolds:
    def __init__(
        self,
        pods: PodResources,
        hold: Callable[[frozenset[str]], object],  # NodeDevices.hold(held, by=...)
        *,
        interval_s: float = INTERVAL_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._pods = pods
        self._hold = hold
        self.interval_s = interval_s
        self._sleep = sleep
        self._used: frozenset[InUse] = frozenset()
        self.held: frozenset[str] = frozenset()  # GPU and MIG UUIDs held Unhealthy now
        self.error: str | None = None  # why the latest List failed; None after a good one

    async def check(self, snapshot: HardwareSnapshot, resources: Sequence[Resource]) -> None:
        """Read what the kubelet has allocated and hold what `resources` must hold back."""
        try:
            listed = await self._pods.list()
        except Exception as exc:  # an absent or failing kubelet never stops serving
            if self.error is None:
                log.warning("pod_resources_unavailable_keeping_holds", error=str(exc))
            self.error = str(exc)
        else:
            if self.error is not None:
                log.info("pod_resources_available")
            self.error = None
            self._used = in_use(listed, snapshot, [r.name for r in resources])
        now = held(resources, self._used)
        if now != self.held:
            self._log(now, resources)
            self.held = now
            self._hold(now)

    async def run(self, serving: Serving) -> None:
        """Check every interval, against what is served then; runs until cancelled."""
        while True:
            await self._sleep(self.interval_s)
            await self.check(*serving())

    def _log(self, now: frozenset[str], resources: Sequence[Resource]) -> None:
        for uuid in sorted(now - self.held):
            by = sorted({u.resource for u in self._used if uuid in (u.gpu_uuid, u.mig_uuid)})
            log.info("device_held", device=uuid, resource=_serving(uuid, resources), in_use_as=by)
        for uuid in sorted(self.held - now):
            log.info("device_released", device=uuid, resource=_serving(uuid, resources))


def _serving(uuid: str, resources: Sequence[Resource]) -> str:
    return next((r.name for r in resources for d in r.devices if d.physical_id == uuid), "")
