"""Process start: `gpuslice run` spawned until every resource registered with the stand-in.

Baseline: `python -c "import grpc"` spawned until it exits, same interpreter and
environment, alternating with the agent. The breakdown shows where the time goes: each
stage is a fresh interpreter importing more, timed from spawn to a line it prints once
its imports are done (so without the exit the baseline includes).
"""

from __future__ import annotations

import statistics

from bench.agent_process import agent_process, interpreter, run_to_exit
from bench.harness import Figure, S, Target
from bench.plan import Plan
from bench.rigs import scratch

FIGURES = ("process_start",)
STUBS = "import grpc.aio\nfrom gpuslice.adapters.deviceplugin.api import pb, pb_grpc"
STAGES = {
    "interpreter": "pass",
    "import grpc": "import grpc",
    "+ grpc.aio and the device-plugin stubs": STUBS,
    "+ click, structlog, yaml, msgspec": f"{STUBS}\nimport click, structlog, yaml, msgspec",
    "every module gpuslice run imports": (
        "import gpuslice.cli, gpuslice.wiring, gpuslice.logs, gpuslice.adapters.fake"
    ),
}


async def breakdown(trials: int) -> dict[str, float]:
    """Stage -> median seconds from spawn to its imports done."""
    times: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for _ in range(trials):
        for stage, code in STAGES.items():
            async with interpreter(code) as (_, ready_s):
                times[stage].append(ready_s)
    return {stage: round(statistics.median(t), 4) for stage, t in times.items()}


async def run(plan: Plan) -> list[Figure]:
    values: list[float] = []
    base: list[float] = []
    await run_to_exit(STUBS)  # warm the file and bytecode caches
    with scratch() as work:
        async with agent_process(work):
            pass
    for _ in range(plan.starts):
        base.append(await run_to_exit("import grpc"))
        with scratch() as work:
            async with agent_process(work) as (_, _, elapsed):
                values.append(elapsed)
    return [
        Figure(
            "process_start",
            "process spawned -> every resource registered (gpuslice run, dgx-a100 x 48)",
            S,
            values,
            (Target(1.5), Target(2.5, "ratio")),
            base,
            'python -c "import grpc", spawned until it exits',
            {"breakdown_s": await breakdown(plan.starts)},
        )
    ]
