"""`gpuslice advise` over many pods and days: wall time and peak RSS of the command.

A synthetic Prometheus (gpuslice.testing.prometheus, its own process) serves 1,000
containers' series (quick: 100 over one day); the command reads 7 days of them at a
30 s step (20,160 points per series, for memory and for utilisation: about 40 million
points), in range queries of bounded size, through the adapter's parser into the core's
distributions, and prints its JSON advice. Each trial is a fresh `gpuslice advise`
process, its peak RSS read from the kernel when it exits (wait4).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.harness import MIB, Figure, S, Target
from bench.plan import Plan

FIGURES = ("advise_1000_pods_7d", "advise_peak_rss")


def _trial(url: str, window: str) -> tuple[float, float, int]:
    """(seconds, peak RSS in MiB, workloads advised) of one command."""
    argv = [sys.executable, "-m", "gpuslice", "advise", "--prometheus", url, "--window",
            window, "--step", "30s", "--end", "1800000000", "--output", "json"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with tempfile.TemporaryFile() as err:  # a file: a full stderr pipe cannot block it
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
        out = proc.stdout.read()  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.perf_counter() - started
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"gpuslice advise failed: {err.read().decode()[-300:]}")
    workloads = len(json.loads(out)["workloads"])
    return elapsed, usage.ru_maxrss / 1024, workloads


def measure(pods: int, window: str, trials: int) -> tuple[list[float], list[float], int]:
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuslice.testing.prometheus", str(pods)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        times, rss, workloads = [], [], 0
        for _ in range(trials):
            seconds, mib, workloads = _trial(url, window)
            times.append(seconds)
            rss.append(mib)
        return times, rss, workloads
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(10)


async def run(plan: Plan) -> list[Figure]:
    pods, window = (1000, "7d") if plan.name == "full" else (100, "1d")
    trials = min(plan.trials, 3)
    times, rss, workloads = await asyncio.to_thread(measure, pods, window, trials)
    detail = {"pods": pods, "window": window, "step": "30s", "workloads": workloads}
    return [
        Figure(FIGURES[0], f"gpuslice advise, {pods} pods x {window} at 30 s", S, times,
               (Target(10.0),), detail=detail),
        Figure(FIGURES[1], "its peak RSS", MIB, rss, (Target(256.0),), detail=detail),
    ]  # fmt: skip
