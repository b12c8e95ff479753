"""How much each benchmark does: the full run and the quick one CI runs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    name: str
    trials: int  # repeated trials per latency figure
    calls: int  # unary calls per trial, on each side (subject and baseline)
    warmup: int  # untimed calls on each side before the first trial
    xid_rigs: int  # fresh agents per XID trial (8 injections each, one per GPU)
    restarts: int  # kubelet restarts per trial
    starts: int  # process starts (and baseline interpreter starts)
    allocates: int  # Allocates sent to the agent process between the RSS readings
    lists: int  # ListAndWatch streams opened per trial
    flips: int  # node label flips per trial
    rss_trials: int  # agent processes (each with a no-op server process) for the RSS figures
    fleet_agents: int  # agents per fleet (bench.fleet)
    fleet_idle_agents: int  # agents per fleet in the accelerated idle window
    fleet_hours: float  # accelerated agent-hours per idle trial
    fleet_restarts: int  # API server restarts
    fleet_outage_s: float  # how long the server stays away on each
    rolls: int  # rolling upgrades in one chain of agents (bench.roll)
    roll_load: bool  # a busy process on every CPU while they roll
    fleet_warming_s: float  # then how long its watch cache fills (watches answered 429)


FULL = Plan(
    name="full",
    trials=5,
    calls=2000,
    warmup=300,
    xid_rigs=3,
    restarts=20,
    starts=5,
    allocates=10_000,
    lists=20,
    flips=10,
    rss_trials=3,
    fleet_agents=100,
    fleet_idle_agents=20,
    fleet_hours=1.0,
    fleet_restarts=3,
    fleet_outage_s=15.0,
    rolls=20,
    roll_load=True,
    fleet_warming_s=3.0,
)

QUICK = Plan(
    name="quick",
    trials=2,
    calls=200,
    warmup=50,
    xid_rigs=1,
    restarts=3,
    starts=1,
    allocates=1_000,
    lists=3,
    flips=2,
    rss_trials=1,
    fleet_agents=10,
    fleet_idle_agents=10,
    fleet_hours=0.25,
    fleet_restarts=1,
    fleet_outage_s=3.0,
    rolls=2,
    roll_load=False,
    fleet_warming_s=1.0,
)
