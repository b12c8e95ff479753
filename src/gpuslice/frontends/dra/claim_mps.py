"""The DRA claims' own MPS control daemons (a MigDeviceConfig asking for MPS), as NVIDIA's
DRA driver runs them: one per claim in `<mpsRoot>/dra-claims/<claim UID>`, with
CUDA_VISIBLE_DEVICES its MIG devices' UUIDs and the config's limits set through the
daemon's commands.

They are services.mps's supervised daemons (MpsDaemons, claims=True), whose plans are the
prepared claims' instead of the node config's: started, adopted after a restart or started
again, restarted when they exit, and quit (never killed) once no claim wants them. While a
claim's daemon does not serve, its MIG devices are held Unhealthy (by "mps-claims"), so
the health stream and the taints show it. Prepare and unprepare wait for the daemon, each
wait bounded by WAIT_S; a daemon that neither starts nor stops in time is the claim's
error, and the kubelet calls again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

import structlog

from gpuslice.core.errors import BackendError
from gpuslice.core.mps import DaemonPlan
from gpuslice.services.mps import WAITING, Hold, MpsDaemons
from gpuslice.services.supervision import State

log = structlog.get_logger("gpuslice.dra")

HOLDER = "mps-claims"
WAIT_S = 30.0  # a start runs `-d`, then sets and reads back the limits; a stop quits
_GAVE_UP = (State.BACKING_OFF, State.FAILED, WAITING)  # WAITING: for mps-control, or clients


class ClaimDaemons:
    def __init__(
        self, daemons: MpsDaemons, hold: Hold, mps_root: str, *, wait_s: float = WAIT_S
    ) -> None:
        self.mps_root = mps_root  # --mps-root: "" when no claim can have a daemon
        self._daemons = daemons
        self._hold = hold
        self.wait_s = wait_s
        self._plans: dict[str, DaemonPlan] = {}  # root -> plan, of the prepared claims

    def restore(self, plans: Iterable[DaemonPlan]) -> None:
        """The daemons of the completed claims (at start): running ones adopted, missing
        ones started, and every other claim daemon under the MPS root quit once idle."""
        self._plans = {p.root: p for p in plans}
        self._apply()

    async def start(self, plan: DaemonPlan) -> None:
        """Start (or adopt) `plan`'s daemon and wait until it serves its limits.
        Raises BackendError; the plan is then dropped again."""
        self._plans[plan.root] = plan
        self._apply()
        supervisor = self._daemons.daemons[plan.root]
        try:
            await self._until(lambda: supervisor.up or supervisor.state in _GAVE_UP)
        except TimeoutError:
            why = supervisor.waiting or f"not serving after {self.wait_s:g}s"
        else:
            why = "" if supervisor.up else supervisor.error
        if why:
            with contextlib.suppress(BackendError):  # left to its supervisor: quit once idle
                await self.stop(plan.root)
            one_line = " ".join(why.split())  # the binary's output may have several
            raise BackendError(f"its MPS control daemon did not start: {one_line}")
        log.info("dra_mps_daemon_serving", resource=plan.resource, gpus=",".join(plan.gpu_uuids),
                 thread_percentage=plan.thread_percentage,
                 pinned_mib=",".join(map(str, plan.pinned_mib)))  # fmt: skip

    async def stop(self, root: str) -> None:
        """Quit the daemon in `root` and wait until it has exited. Raises BackendError
        when it is still there after WAIT_S (its clients have not left)."""
        self._plans.pop(root, None)
        self._apply()
        supervisor = self._daemons.daemons.get(root)
        if supervisor is None:
            return
        try:
            await self._until(lambda: supervisor.state is State.STOPPED)
        except TimeoutError:
            why = supervisor.waiting or f"still running after {self.wait_s:g}s"
            raise BackendError(f"its MPS control daemon did not stop: {why}") from None

    async def close(self) -> None:
        """Stop supervising; the daemons run on for the next agent."""
        await self._daemons.close()

    def _apply(self) -> None:
        self._daemons.apply(self._plans.values(), self._hold, self.mps_root)

    async def _until(self, condition: Callable[[], bool]) -> None:
        await asyncio.wait_for(self._daemons.settled(condition), self.wait_s)
