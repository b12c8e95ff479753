"""Rolling upgrades under load: pods refused, and how long allocatable read 0.

One chain of `gpuslice run --fake-hardware t4x4` processes against the kubelet stand-in
(which keeps a resource's current client, and drops it, as the kubelet does): each roll
starts a successor beside the agent serving (DaemonSet maxSurge), waits until it waits for
the directory, SIGTERMs the old one and waits until the successor serves; a pod is
admitted (then released) every PERIOD_S throughout, and the full plan burns every CPU with
busy processes meanwhile.

Baseline, in the same run, when BENCH_ROLL_BASELINE_SRC names the `src` directory of
another checkout (say main's, by `git archive main src`): the same rolls with that
checkout's agents, under the same load: `git archive <commit> src` of an earlier hand-over
order (docs/benchmarks.md names the ones measured) compares that order with this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from dataclasses import dataclass, field

from bench.harness import MS, Figure, Target
from bench.plan import Plan
from bench.rigs import GPU, scratch
from bench.runtime_env import runtime_env
from bench.upgrade import AGENT, TIMEOUT_S, Agent, start_agent
from gpuslice.testing.kubelet import AdmissionError, KubeletStandin

FIGURES = ("upgrade_roll_failures", "upgrade_roll_window")
PERIOD_S = 0.1
SETTLE_S = 0.5  # pods go on with the successor alone before the next roll
BURN_S = 600  # a burner ends by itself after this, whatever happens to the bench
BASELINE_SRC = "BENCH_ROLL_BASELINE_SRC"
_BURN = f"import time\nend = time.monotonic() + {BURN_S}\nwhile time.monotonic() < end: pass\n"


@dataclass
class Rolls:
    failed: list[int] = field(default_factory=list)  # pods refused, per roll
    window_ms: list[float] = field(default_factory=list)  # allocatable at 0, per roll
    refusals: list[str] = field(default_factory=list)


class _Pods:
    """A pod admitted (then released) every PERIOD_S; refusals kept."""

    def __init__(self, kubelet: KubeletStandin) -> None:
        self.kubelet = kubelet
        self.failed: list[str] = []
        self._count = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            pod = f"pod-{self._count}"
            self._count += 1
            try:
                await self.kubelet.admit(pod, {"main": {GPU: 1}})
            except AdmissionError as exc:
                self.failed.append(f"{pod}: {exc}")
            else:
                await self.kubelet.release(pod)
            await asyncio.sleep(PERIOD_S)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def _burners(count: int) -> list[asyncio.subprocess.Process]:
    return [await asyncio.create_subprocess_exec(sys.executable, "-c", _BURN) for _ in range(count)]


async def roll(count: int, command: list[str], env: dict[str, str]) -> Rolls:
    """`count` rolls of one chain of agents (see the module doc)."""
    out = Rolls()
    with scratch() as work:
        plugins = os.path.join(work, "plugins")
        os.mkdir(plugins)
        async with KubeletStandin(plugins) as kubelet:
            agents: list[Agent] = [await start_agent(plugins, command, env)]
            pods: _Pods | None = None
            try:
                await kubelet.wait_for(lambda k: k.serves({GPU: 4}), TIMEOUT_S)
                pods = _Pods(kubelet)
                for _ in range(count):
                    failed, unserved = len(pods.failed), kubelet.unserved_s(GPU)
                    agents.append(await start_agent(plugins, command, env))
                    await asyncio.wait_for(agents[-1].waiting.wait(), TIMEOUT_S)
                    await agents[-2].stop()
                    await kubelet.wait_for(lambda k: k.serves({GPU: 4}), TIMEOUT_S)
                    await asyncio.sleep(SETTLE_S)
                    out.failed.append(len(pods.failed) - failed)
                    out.window_ms.append((kubelet.unserved_s(GPU) - unserved) * 1000)
            finally:
                if pods is not None:
                    await pods.stop()
                    out.refusals = pods.failed
                for agent in agents:
                    await agent.stop()
    return out


async def _measure(plan: Plan, command: list[str], env: dict[str, str]) -> Rolls:
    burners = await _burners(os.cpu_count() or 1) if plan.roll_load else []
    try:
        return await roll(plan.rolls, command, env)
    finally:
        for proc in burners:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def run(plan: Plan) -> list[Figure]:
    ours = await _measure(plan, AGENT, runtime_env())
    base: Rolls | None = None
    src = os.environ.get(BASELINE_SRC)
    if src:
        env = runtime_env()
        env["PYTHONPATH"] = os.pathsep.join((env["PYTHONPATH"], src))
        base = await _measure(plan, [sys.executable, "-m", "gpuslice"], env)
    setup = {
        "rolls": plan.rolls,
        "pod_period_ms": PERIOD_S * 1000,
        "cpu_burners": (os.cpu_count() or 1) if plan.roll_load else 0,
        "refusals": ours.refusals[:10],
    }
    if base is not None:
        setup["baseline_refusals"] = base.refusals[:10]
    what = f"the same rolls with the agents of {src}"
    return [
        Figure(
            "upgrade_roll_failures",
            f"pods refused over {plan.rolls} rolls, one pod every {PERIOD_S * 1000:g} ms (t4x4)",
            "pods",
            [float(sum(ours.failed))],
            (Target(0),),
            None if base is None else [float(sum(base.failed))],
            what,
            {"setup": setup},
        ),
        Figure(
            "upgrade_roll_window",
            "allocatable 0 in one roll under load (t4x4)",
            MS,
            ours.window_ms,
            (Target(50),),
            None if base is None else base.window_ms,
            what,
        ),
    ]
