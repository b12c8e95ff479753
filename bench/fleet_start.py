"""A fleet started at once while the API server is in a brown-out: it refuses connections
for plan.fleet_outage_s, then answers later than the agents' read timeout for LATE_S, then
on time again. The agents are bench.fleet's (the config manager following the ConfigMap and
the Node through the API, with their labeller), all in this process.

- Exits: agents whose run ended with an error during the brown-out. Baseline: an `old`
  fleet in the same brown-out whose first reads give up at the first failure, as every
  agent did before (it stopped with the one-line error, and its DaemonSet crash-looped).
- Convergence: seconds from the server answering on time until every agent of the `new`
  fleet applied its config. Baseline: the same number of fresh agents started against the
  server on time, from their start until all applied (a start with no brown-out at all).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.fleet import NEW, NS, Fleet, agent, entry
from bench.harness import Figure, S, Target, now
from bench.plan import Plan
from bench.rigs import scratch
from gpuslice.core.errors import BackendError
from gpuslice.services.api_wait import ApiWait
from gpuslice.services.config_source import DEFAULT_ANNOTATION
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig

FIGURES = ("fleet_slow_start_exits", "fleet_slow_start")
READ_TIMEOUT_S = 1.0  # the agents' client timeout here (10 s as shipped): shorter phases
LATE_S = 3.0 * READ_TIMEOUT_S  # answers held this long past it: every read times out


async def _give_up(_delay_s: float) -> None:
    """The former start: the first failed read ended the agent."""
    raise BackendError("first read failed: the agent stops")


class Run:
    """One fleet's agents as tasks, on the server of `work`."""

    def __init__(self, server: FakeApiServer, kubeconfig: str, fleet: Fleet, stop: asyncio.Event):
        self.server, self.kubeconfig, self.fleet, self.stop = server, kubeconfig, fleet, stop
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, seed: int, wait: ApiWait | None = None) -> None:
        cm = self.fleet.config_map
        self.server.put_config_map(NS, cm, entry(4), {DEFAULT_ANNOTATION: "ts"})
        for i in range(self.fleet.agents):
            node = self.fleet.node(i)
            self.server.put_node(node)
            run = agent(self.server, self.kubeconfig, self.fleet, node, NEW, self.stop,
                        seed + i, 1.0, api_wait=wait, timeout_s=READ_TIMEOUT_S)  # fmt: skip
            self.tasks.append(asyncio.create_task(run))

    @property
    def exited(self) -> int:
        return sum(t.done() and not t.cancelled() and t.exception() is not None
                   for t in self.tasks)  # fmt: skip


async def brown_out(work: str, agents: int, outage_s: float) -> tuple[int, int, float, float]:
    """(exits of `new`, exits of `old`, seconds to converge after, seconds for a cold start)."""
    async with FakeApiServer() as server:
        kubeconfig = write_kubeconfig(Path(work), server.url)
        port = int(server.url.rsplit(":", 1)[1])
        stop = asyncio.Event()
        new = Run(server, kubeconfig, Fleet("new", "new-configs", agents), stop)
        old = Run(server, kubeconfig, Fleet("old", "old-configs", agents), stop)
        cold = Run(server, kubeconfig, Fleet("cold", "cold-configs", agents), stop)
        try:
            await server.close()  # refused
            new.start(0)
            old.start(1000, ApiWait(sleep=_give_up))
            await asyncio.sleep(outage_s)
            server.answer_late(60.0)
            await server.start(port)  # listening, every answer past the read timeout
            await asyncio.sleep(LATE_S)
            server.on_time()
            back = now()
            converged = max(await new.fleet.until_applied(4)) - back
            began = now()
            cold.start(2000)
            cold_s = max(await cold.fleet.until_applied(4)) - began
            return new.exited, old.exited, converged, cold_s
        finally:
            stop.set()
            await asyncio.gather(*new.tasks, *old.tasks, *cold.tasks, return_exceptions=True)


async def run(plan: Plan) -> list[Figure]:
    exits: list[float] = []
    former: list[float] = []
    converge: list[float] = []
    cold: list[float] = []
    for _ in range(plan.fleet_restarts):
        with scratch() as work:
            ours, theirs, after_s, cold_s = await brown_out(
                work, plan.fleet_agents, plan.fleet_outage_s
            )
        exits.append(ours)
        former.append(theirs)
        converge.append(after_s)
        cold.append(cold_s)
    how = {
        "agents": plan.fleet_agents,
        "refused_s": plan.fleet_outage_s,
        "late_s": LATE_S,
        "read_timeout_s": READ_TIMEOUT_S,
    }
    return [
        Figure(
            "fleet_slow_start_exits",
            f"Agents of {plan.fleet_agents} started in an API brown-out (refused, then "
            "answers past the read timeout) that exited",
            "agents", exits, (Target(0.0),), former,
            "the same agents giving up at the first failed read (the former start)", how,
        ),
        Figure(
            "fleet_slow_start",
            "API on time again after a brown-out at start -> every agent applied its config",
            S, converge, (Target(15.0),), cold,
            "as many fresh agents started against the server on time, start -> all applied",
            how,
        ),
    ]  # fmt: skip
