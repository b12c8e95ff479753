"""An API server restart at fleet scale: how soon each agent's watches are back, and the herd.

Two fleets of plan.fleet_agents agents (bench.fleet's: what `gpuslice run --config-map` with
labels on asks of the API, many in this process, each with its own HTTP client, over real
HTTP) on one API server stand-in: `new` as the agent ships, and `former`, the same code
with the retry rule as it was (FormerRetry). The server restarts as a real one does: every
connection cut, nothing listening for plan.fleet_outage_s, then listening with its watch
cache filling for plan.fleet_warming_s (every watch answered 429 with Retry-After 1, reads
served), then ready, with a watch cache newer than every version held (410, then watches
from now as streaming lists).

- api_restart_reopen_p50, api_restart_reopen_max: seconds from the server's readiness until
  a watch is open again, p50 and max over the fleet's watches (each agent's Node and
  ConfigMap watches); baseline: the `former` fleet in the same restart.
- api_restart_peak_rps: the most requests the server received from the `new` fleet in one
  second (sliding, sampled every 5 ms) from the restart until every agent was back, per
  100 agents; baseline: the `former` fleet's. Target: at most twice it (no herd: the
  prompt return is spread over the probe window rather than bunched).
- api_restart_refused_lists_switch_max: once more, the server restarted refusing streaming
  lists as one over etcd 3.4 does (watch_lists_refused); once every watch is back, the
  `new` fleet's ConfigMap edited: seconds until the last agent applied it (the p50 in the
  details); baseline: the same edit made just before that restart.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from bench.fleet import Fleet, fleets, switch
from bench.harness import Figure, S, Target, now, percentile
from bench.plan import Plan
from bench.rigs import scratch
from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.adapters.kube.watch import Retry
from gpuslice.core.restart import jittered
from gpuslice.testing.apiserver import FakeApiServer
from gpuslice.testing.apiserver.watches import STORAGE

FIGURES = (
    "api_restart_reopen_p50",
    "api_restart_reopen_max",
    "api_restart_peak_rps",
    "api_restart_refused_lists_switch_max",
)
STEP_S = 0.005
WAIT_S = 120.0
PER = 100  # the herd is given per this many agents


class FormerRetry(Retry):
    """The rule before: one count of failures in a row, answered or not, so the first
    answers of a returning server were waited out on the long schedule at the outage's
    count; +-20 % jitter."""

    def __init__(self, initial_s: float, cap_s: float, *, probe_cap_s: float, seed: int) -> None:
        super().__init__(initial_s, cap_s, probe_cap_s=probe_cap_s)
        self._draw = random.Random(seed).uniform

    def next_delay(self, *, unreachable: bool = False) -> float:
        self.failures += 1
        schedule = self.probe if unreachable else self.schedule
        return jittered(schedule.delay(self.failures), self._draw)


class FormerApi(KubeNodeApi):
    """KubeNodeApi with FormerRetry."""

    def _retry(self) -> Retry:
        seed = self._rand.randrange(1 << 30)
        return FormerRetry(*self._backoff_s, probe_cap_s=self._probe_cap_s, seed=seed)


class Watching:
    """When each watch of a fleet was open again (each Node's by name; the shared
    ConfigMap's, which no request tells apart, the k-th to open), and the fleet's
    requests over time, sampled every STEP_S."""

    def __init__(self, server: FakeApiServer, fleet: Fleet) -> None:
        self.server, self.fleet = server, fleet
        self.nodes: dict[str, float] = {}
        self.config_maps: list[float] = []
        self.sent: list[float] = []  # when each request of the fleet was seen

    def clear(self) -> None:
        self.nodes.clear()
        self.config_maps.clear()

    @property
    def back(self) -> list[float]:
        return [*self.nodes.values(), *self.config_maps]

    def sample(self, seen: int) -> None:
        t = now()
        self.sent += [t for r in self.server.requests[seen:] if self.fleet.owns(r)]
        names = [s.wanted.get("metadata.name", "") for s in self.server.watch_state.streams]
        for name in names:
            mine = name.startswith(f"{self.fleet.prefix}-") and name != self.fleet.config_map
            if mine and name not in self.nodes:
                self.nodes[name] = t
        while len(self.config_maps) < names.count(self.fleet.config_map):
            self.config_maps.append(t)

    def peak_rps(self, start: float) -> float:
        times = [t for t in self.sent if t >= start]
        j, best = 0, 0
        for i, t in enumerate(times):
            while times[j] < t - 1.0:
                j += 1
            best = max(best, i - j + 1)
        return best * PER / self.fleet.agents


async def until(check: Callable[[], bool], step: Callable[[], None], what: str) -> None:
    deadline = now() + WAIT_S
    while not check():
        if now() > deadline:
            raise TimeoutError(f"not within {WAIT_S:g} s: {what}")
        step()
        await asyncio.sleep(STEP_S)


async def restart(
    server: FakeApiServer, fleets_: list[Fleet], outage_s: float, warming_s: float
) -> list[tuple[list[float], float]]:
    """Each fleet's reopen delays (from readiness) and its peak requests a second."""
    watching = [Watching(server, f) for f in fleets_]
    seen = len(server.requests)

    def step() -> None:
        nonlocal seen
        for w in watching:
            w.sample(seen)
        seen = len(server.requests)

    start = now()
    down, warming = asyncio.Event(), asyncio.Event()
    restarting = asyncio.create_task(server.restart(down, warming))
    await asyncio.sleep(outage_s)
    down.set()
    await restarting
    deadline = now() + warming_s
    while now() < deadline:
        step()
        await asyncio.sleep(STEP_S)
    for w in watching:
        w.clear()  # none can be open before readiness
    ready = now()
    warming.set()
    await until(lambda: all(len(w.back) == 2 * w.fleet.agents for w in watching), step,
                "every agent's watches back")  # fmt: skip
    return [([t - ready for t in w.back], w.peak_rps(start)) for w in watching]


async def run(plan: Plan) -> list[Figure]:
    p50: list[float] = []
    worst: list[float] = []
    peak: list[float] = []
    before: dict[str, list[float]] = {"p50": [], "max": [], "peak": []}
    with scratch() as work:
        sizes = {"new": plan.fleet_agents, "former": plan.fleet_agents}
        async with fleets(work, sizes, apis={"former": FormerApi}) as (server, made):
            for _ in range(plan.fleet_restarts):
                ours, theirs = await restart(
                    server, [made["new"], made["former"]], plan.fleet_outage_s,
                    plan.fleet_warming_s,
                )  # fmt: skip
                p50.append(percentile(ours[0], 50))
                worst.append(max(ours[0]))
                peak.append(ours[1])
                before["p50"].append(percentile(theirs[0], 50))
                before["max"].append(max(theirs[0]))
                before["peak"].append(theirs[1])
            served = await switch(server, made["new"], 8)
            server.watch_lists_refused = STORAGE
            await restart(server, [made["new"], made["former"]], plan.fleet_outage_s,
                          plan.fleet_warming_s)  # fmt: skip
            refused = await switch(server, made["new"], 4)
    detail = {"agents": plan.fleet_agents, "outage_s": plan.fleet_outage_s,
              "warming_s": plan.fleet_warming_s, "in": "one process (watch clients)"}  # fmt: skip
    former = "the same agents with the former retry rule, same restart"
    title = "API server restart -> an agent's node and ConfigMap watches open again, from "
    return [
        Figure("api_restart_reopen_p50", title + "the server's readiness, p50", S, p50,
               (Target(5.0),), before["p50"], former, detail),
        Figure("api_restart_reopen_max", title + "the server's readiness, max", S, worst,
               (Target(5.0),), before["max"], former, detail),
        Figure("api_restart_peak_rps",
               f"API server restart -> requests in the busiest second, per {PER} agents",
               "req/s", peak, (Target(2.0, on="ratio"),), before["peak"], former, detail),
        Figure("api_restart_refused_lists_switch_max",
               "ConfigMap edit -> applied by the last agent, after a restart of a server "
               "refusing streaming lists (etcd 3.4)", S, [max(refused)], (Target(1.0),),
               [max(served)], "the same edit before that restart",
               {**detail, "p50_s": percentile(refused, 50),
                "baseline_p50_s": percentile(served, 50)}),
    ]  # fmt: skip
