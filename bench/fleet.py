"""A fleet of agents against one API server stand-in: idle traffic and switch fan-out
(an API server restart: bench.api_restart).

Each agent is what talks to the API in `gpuslice run --config-map` with labels on, built
from the real services: a KubeNodeApi with its own HTTP client, the config manager
following its Node's label and the shared ConfigMap through it (two watches), and the
labeller publishing a NodeFeature through it. All in this process, over real HTTP to
the stand-in; no kubelet or GPUs (they make no API request).

Two fleets run side by side on the same server, each with its own ConfigMap and Nodes:
`new` as the agent ships, and `old`, the same code set to the timings it had before (a
fixed 240 s watch timeout, the NodeFeature read at every labelling, failures retried up
to 30 s whether the server answers or not).

- Idle requests per agent-hour (fleets of plan.fleet_idle_agents): an accelerated clock.
  The stand-in ends watches after timeoutSeconds / SPEEDUP, the labelling interval is
  60 s / SPEEDUP and the NodeFeature re-check runs on a clock SPEEDUP times as fast, so
  one real second is SPEEDUP seconds of an idle agent's life. Every request the server
  receives from a fleet in the window (after start-up), per agent, per accelerated hour;
  writes (POST, PUT, PATCH, DELETE) counted apart.
From here on, fresh fleets of plan.fleet_agents in real time.
- Switch fan-out: the entry in force in `new`'s ConfigMap edited (4 <-> 8 replicas);
  seconds until each agent applied it; p99 over all agents and flips of a trial.
  Baseline: one agent alone, with a ConfigMap of its own, edited right after.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from httpx2 import Timeout
from lightkube import AsyncClient, KubeConfig

from bench.harness import MS, Figure, Target, now, percentile
from bench.plan import Plan
from bench.rigs import scratch
from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.config.convert import resource_settings
from gpuslice.config.loader import LoadedConfig
from gpuslice.services.api_wait import ApiWait
from gpuslice.services.config_manager import ConfigInputs, ConfigManager
from gpuslice.services.config_source import DEFAULT_ANNOTATION, ConfigMapEntries
from gpuslice.services.labeller import Labeller, LabelPolicy, NodeFeatureSink
from gpuslice.testing.apiserver import FakeApiServer, Request, write_kubeconfig

FIGURES = ("fleet_idle_requests", "fleet_switch_p99")
NS = "gpuslice"
SPEEDUP = 120.0  # accelerated seconds per real second in the idle window
INTERVAL_S = 60.0  # the labelling interval (GFD's sleep-interval)
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
WAIT_S = 120.0  # the longest anything here may take before the group fails


def entry(replicas: int) -> dict[str, str]:
    text = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
    return {"ts": text}


@dataclass
class Fleet:
    """Agents whose names start with `prefix`, and the ConfigMap they follow."""

    prefix: str
    config_map: str
    agents: int
    applied: dict[str, tuple[int, float]] = field(default_factory=dict)  # replicas, when
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def node(self, i: int) -> str:
        return f"{self.prefix}-{i:03d}"

    def owns(self, request: Request) -> bool:
        text = f"{request.path} {request.query.get('fieldSelector', '')}"
        return f"{self.prefix}-" in text

    def open_watches(self, server: FakeApiServer) -> int:
        names = (s.wanted.get("metadata.name", "") for s in server.watch_state.streams)
        return sum(name.startswith(f"{self.prefix}-") for name in names)

    async def record(self, node: str, replicas: int) -> None:
        async with self.changed:
            self.applied[node] = (replicas, now())
            self.changed.notify_all()

    async def until_applied(self, replicas: int) -> list[float]:
        """When each agent applied `replicas` (once all have)."""
        async with asyncio.timeout(WAIT_S), self.changed:
            await self.changed.wait_for(
                lambda: (
                    len(self.applied) == self.agents
                    and all(r == replicas for r, _ in self.applied.values())
                )
            )
        return [t for _, t in self.applied.values()]


@dataclass(frozen=True)
class Timings:
    """What differs between the agent as shipped and the same code set as it was."""

    watch_timeout_s: tuple[int, int]
    recheck_s: tuple[float, float]
    probe_cap_s: float


NEW = Timings((300, 600), (600.0, 1200.0), 2.0)
OLD = Timings((240, 240), (0.0, 0.0), 30.0)


async def agent(
    server: FakeApiServer, kubeconfig: str, fleet: Fleet, node: str, timings: Timings,
    stop: asyncio.Event, seed: int, speedup: float, api_type: type[KubeNodeApi] = KubeNodeApi,
    *, api_wait: ApiWait | None = None, timeout_s: float = 10.0,
) -> None:  # fmt: skip
    """One agent until `stop`: the config manager and the labeller over one KubeNodeApi
    (`api_wait`: how its first reads wait out the API; `timeout_s`: its client's)."""
    client = AsyncClient(
        config=KubeConfig.from_file(kubeconfig), trust_env=False, timeout=Timeout(timeout_s)
    )
    rand = random.Random(seed)
    api = api_type(
        client,
        host=node,
        watch_timeout_s=timings.watch_timeout_s,
        recheck_s=timings.recheck_s,
        probe_cap_s=timings.probe_cap_s,
        clock=lambda: time.monotonic() * speedup,
        rand=rand,
    )
    replicas = 1

    def to_settings(loaded: LoadedConfig) -> int:
        rules = resource_settings(loaded.config).sharing.rules
        return rules[0].replicas if rules else 1

    async def labels() -> Mapping[str, str]:
        return {"nvidia.com/gpu.replicas": str(replicas), "nvidia.com/gpu.count": "8"}

    labeller = Labeller(
        labels,
        [NodeFeatureSink(api, node, NS)],
        LabelPolicy(interval_s=INTERVAL_S / speedup, timestamps=False),
        rand=rand,
    )

    async def apply(settings: int) -> None:
        nonlocal replicas
        replicas = settings
        labeller.nudge()
        await fleet.record(node, settings)

    entries = ConfigMapEntries(api, NS, fleet.config_map)
    manager = ConfigManager(ConfigInputs(api, node, entries, to_settings), apply, api_wait=api_wait)
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(manager.run(stop))
            await manager.ready.wait()
            tasks.create_task(labeller.run(stop))
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def fleets(
    work: str,
    sizes: Mapping[str, int],
    speedup: float = 1.0,
    apis: Mapping[str, type[KubeNodeApi]] | None = None,
) -> AsyncIterator[tuple[FakeApiServer, dict[str, Fleet]]]:
    """The server and one fleet per prefix (`new` and `one` as shipped, `old` at the timings
    it had; `apis` names another KubeNodeApi for a prefix), every agent serving 4 replicas
    and its NodeFeature written; their timers, and the server's watch timeouts, `speedup`
    times as fast."""
    async with FakeApiServer() as server:
        server.time_scale = speedup
        kubeconfig = write_kubeconfig(Path(work), server.url)
        made = {p: Fleet(p, f"{p}-configs", n) for p, n in sizes.items()}
        stop = asyncio.Event()
        tasks = []
        for seed, (prefix, fleet) in enumerate(made.items()):
            server.put_config_map(NS, fleet.config_map, entry(4), {DEFAULT_ANNOTATION: "ts"})
            timings = OLD if prefix == "old" else NEW
            for i in range(fleet.agents):
                server.put_node(fleet.node(i))
                node, seed_i = fleet.node(i), seed * 1000 + i
                api_type = (apis or {}).get(prefix, KubeNodeApi)
                run = agent(
                    server, kubeconfig, fleet, node, timings, stop, seed_i, speedup, api_type
                )
                tasks.append(asyncio.create_task(run))
        try:
            for fleet in made.values():
                await fleet.until_applied(4)
            await wait_until(
                lambda: len(server.features) == sum(sizes.values()), "every NodeFeature written"
            )
            yield server, made
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)


async def wait_until(check: Callable[[], bool], what: str, step_s: float = 0.005) -> float:
    """Poll `check` (a state no event announces here); the time it first held."""
    deadline = now() + WAIT_S
    while not check():
        if now() > deadline:
            raise TimeoutError(f"not within {WAIT_S:g} s: {what}")
        await asyncio.sleep(step_s)
    return now()


async def idle(server: FakeApiServer, fleets_: list[Fleet], hours: float) -> list[dict[str, float]]:
    """Requests and writes per agent-hour of each fleet over `hours` accelerated hours."""
    start = len(server.requests)
    await asyncio.sleep(hours * 3600.0 / SPEEDUP)
    seen = server.requests[start:]
    out = []
    for fleet in fleets_:
        mine = [r for r in seen if fleet.owns(r)]
        per = fleet.agents * hours
        writes = sum(r.method in WRITES for r in mine)
        gets = sum(r.method == "GET" and not r.is_watch for r in mine)
        watches = sum(r.is_watch for r in mine)
        out.append(
            {
                "all": len(mine) / per,
                "writes": writes / per,
                "reads": gets / per,
                "watches": watches / per,
            }
        )
    return out


async def switch(server: FakeApiServer, fleet: Fleet, replicas: int) -> list[float]:
    """Seconds until each agent applied the edit; returns once their labels followed."""
    t0 = now()
    server.put_config_map(NS, fleet.config_map, entry(replicas), {DEFAULT_ANNOTATION: "ts"})
    applied = [t - t0 for t in await fleet.until_applied(replicas)]
    want = str(replicas)

    def labelled() -> bool:
        mine = [f for (_, name), f in server.features.items() if f"-{fleet.prefix}-" in name]
        return all(f["spec"]["labels"]["nvidia.com/gpu.replicas"] == want for f in mine)

    await wait_until(labelled, "the switch in every NodeFeature")
    return applied


async def run(plan: Plan) -> list[Figure]:
    idle_new: list[float] = []
    idle_old: list[float] = []
    writes: list[float] = []
    switch_p99: list[float] = []
    single_p99: list[float] = []
    details: list[dict[str, float]] = []
    former: list[dict[str, float]] = []
    with scratch() as work:
        # a rate per agent: a few agents give it, more would only make the loop lag
        idle_sizes = {"new": plan.fleet_idle_agents, "old": plan.fleet_idle_agents}
        async with fleets(work, idle_sizes, SPEEDUP) as (server, made):
            for _ in range(plan.trials):
                ours, theirs = await idle(server, [made["new"], made["old"]], plan.fleet_hours)
                idle_new.append(ours["all"])
                idle_old.append(theirs["all"])
                writes.append(ours["writes"])
                details.append(ours)
                former.append(theirs)
    with scratch() as work:  # real time from here on
        sizes = {"new": plan.fleet_agents, "one": 1}
        async with fleets(work, sizes) as (server, made):
            new, one = made["new"], made["one"]
            replicas = 4
            for _ in range(plan.trials):
                fleet_s: list[float] = []
                alone_s: list[float] = []
                for _ in range(plan.flips):
                    replicas = 8 if replicas == 4 else 4
                    fleet_s += await switch(server, new, replicas)
                    alone_s += await switch(server, one, replicas)
                switch_p99.append(percentile(fleet_s, 99) * 1e3)
                single_p99.append(percentile(alone_s, 99) * 1e3)
    agents = {"agents": plan.fleet_agents}
    how = (
        f"accelerated {SPEEDUP:g}x: watch timeouts, labelling interval and NodeFeature "
        f"re-check run {SPEEDUP:g} times as fast; {plan.fleet_hours:g} agent-hours per trial"
    )
    parts = {k: round(sum(d[k] for d in details) / len(details), 1) for k in details[0]}
    parts_before = {k: round(sum(d[k] for d in former) / len(former), 1) for k in former[0]}
    return [
        Figure(
            "fleet_idle_requests",
            "Idle requests per agent-hour (node + ConfigMap watches, NodeFeature publishing)",
            "req/h", idle_new, (Target(60.0),), idle_old,
            "the same code at its former timings (240 s watches, NodeFeature read each minute)",
            {"agents": plan.fleet_idle_agents, "computed": how,
             "writes_per_agent_hour": max(writes),
             "per_agent_hour": parts, "baseline_per_agent_hour": parts_before},
        ),
        Figure(
            "fleet_switch_p99",
            f"ConfigMap switch -> applied by each of {plan.fleet_agents} agents, p99",
            MS, switch_p99, (Target(1000.0),), single_p99, "one agent alone, p99",
            {**agents, "flips_per_trial": plan.flips},
        ),
    ]  # fmt: skip
