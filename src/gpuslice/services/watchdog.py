"""The memory-budget watchdog: fed each accounting sample, it acts on containers over
their budget as the policy says (core.watchdog), logs each action, records an Event on
the Pod and counts it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import structlog

from gpuslice.core.attribution import MIB, Attribution, ContainerUsage
from gpuslice.core.devices import HardwareSnapshot
from gpuslice.core.metrics import GpuRef
from gpuslice.core.ports import Metrics, PodEvents
from gpuslice.core.watchdog import Breach, Key, NotProvenError, Policy, budgets, decide

log = structlog.get_logger("gpuslice.watchdog")

REASON = "GPUMemoryOverBudget"


class Watchdog:
    def __init__(
        self,
        policy: Policy,
        overrides: Mapping[str, int],
        hardware: Callable[[], HardwareSnapshot],
        *,
        hold: Callable[[frozenset[str]], object],  # NodeDevices.hold(held, by=...)
        kill: Callable[[int], Awaitable[None]],  # end a PID proven in its container
        events: PodEvents | None,
        metrics: Metrics,
        enforced: Callable[[], frozenset[str]] = frozenset,  # GPUs the driver's limits bound
    ) -> None:
        self._enforced = enforced
        self.stood_down: frozenset[str] = frozenset()  # GPUs left to the driver's limits
        self.policy = policy
        self._overrides = dict(overrides)
        self._hardware = hardware
        self._hold = hold
        self._kill = kill
        self._events = events
        self._metrics = metrics
        self._over: frozenset[Key] = frozenset()
        self._held: frozenset[str] = frozenset()
        self.latest: list[tuple[ContainerUsage, int]] = []  # (container, budget) of the last sample
        self.actions = 0

    async def check(self, result: Attribution) -> None:
        """Act on one sample's containers over budget."""
        enforced = self._enforced()
        if enforced != self.stood_down:  # nothing there can go over: the driver refuses first
            log.info("memory_budget_enforced_by_driver", gpus=sorted(enforced), action="none")
            self.stood_down = enforced
        watched = [c for c in result.containers if c.gpu_uuid not in enforced]
        self.latest = budgets(self._hardware(), watched, self._overrides)
        decision = decide(self.policy, self.latest, self._over)
        self._over = decision.over
        if decision.held != self._held:
            self._held = decision.held
            self._hold(decision.held)
            log.info("memory_budget_hold", gpus=sorted(decision.held))
        for breach in decision.act:
            await self._act(breach)

    async def _act(self, breach: Breach) -> None:
        u = breach.usage
        outcome, done = {
            Policy.REPORT: ("reported", "reported"),
            Policy.UNHEALTHY: ("held", f"every replica of GPU {u.gpu_index} marked Unhealthy"),
        }.get(self.policy, ("", ""))
        if self.policy is Policy.TERMINATE:
            outcome, done = await self._terminate(u)
            if outcome == "gone":  # killed at an earlier sample and still listed: said then
                log.info("memory_budget_process_gone", pod=f"{u.namespace}/{u.pod}", detail=done)
                return
        log.warning(
            "memory_budget_exceeded",
            namespace=u.namespace,
            pod=u.pod,
            container=u.container,
            resource=u.resource,
            gpu=u.gpu_index,
            used_mib=u.memory_used_bytes // MIB,
            budget_mib=breach.budget_bytes // MIB,
            policy=self.policy.value,
            outcome=outcome,
        )
        self.actions += 1
        self._metrics.budget_action(
            GpuRef(u.gpu_index, u.gpu_uuid, u.model_name), u.resource, self.policy.value, outcome
        )
        if self._events is not None:
            await self._events.record_pod_event(
                u.namespace, u.pod, u.pod_uid, REASON, f"{breach.message}: {done}", warning=True
            )

    async def _terminate(self, u: ContainerUsage) -> tuple[str, str]:
        """SIGKILL its process using the most memory."""
        if not u.pids:
            return "gone", "no process left to kill"
        pid = u.pids[0]
        try:
            await self._kill(pid)
        except ProcessLookupError:
            return "gone", f"process {pid} had already exited"
        except NotProvenError as exc:
            log.warning("memory_budget_kill_refused", pid=pid, reason=str(exc))
            return "refused", f"process {pid} not killed: {exc}"
        except OSError as exc:
            log.error("memory_budget_kill_failed", pid=pid, error=str(exc))
            return "failed", f"process {pid} could not be killed: {exc.strerror or exc}"
        return "killed", f"process {pid} killed (SIGKILL)"
