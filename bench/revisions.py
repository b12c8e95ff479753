"""This checkout against another revision, alternating in one run: start-up, idle RSS
and Allocate latency of `gpuslice run` (bench.agent_process: dgx-a100, 48 replicas).

    .venv/bin/python -m bench.revisions main     # or any git revision

The other revision's src/ is exported to a scratch directory (git archive) and put on
the agent's PYTHONPATH; this checkout's src/ is put there the same way, so both sides
start alike. Each trial starts one agent of each (the order alternates), waits for
registration, lets it settle, reads its VmRSS and times sequential Allocate calls
through the kubelet stand-in. Ratios are this checkout over the other, per trial.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

from bench.agent_process import agent_process, vmrss_mib
from bench.harness import now, percentile
from bench.rigs import GPU, REPO, quiet_logs, scratch

SETTLE_S = 3.0
CALLS = 200


def export_src(rev: str, into: str) -> str:
    """`rev`'s src/ under `into`; its path."""
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "src"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return str(Path(into) / "src")


async def one_agent(src: str) -> dict[str, float]:
    """Start-up seconds, idle RSS MiB and Allocate p50/p99 ms of one agent."""
    with scratch() as work:
        async with agent_process(work, src) as (proc, kubelet, elapsed):
            await asyncio.sleep(SETTLE_S)
            rss = vmrss_mib(proc.pid)
            ids = sorted(kubelet.devices(GPU))
            times = []
            for i in range(CALLS):
                t0 = now()
                await kubelet.allocate(GPU, [[ids[i % len(ids)]]])
                times.append((now() - t0) * 1000)
    return {
        "start_s": elapsed,
        "idle_rss_mib": rss,
        "allocate_p50_ms": percentile(times, 50),
        "allocate_p99_ms": percentile(times, 99),
    }


async def compare(rev: str, trials: int) -> dict[str, object]:
    with scratch("gsb-rev-") as base_dir:
        base_src, ours = export_src(rev, base_dir), str(REPO / "src")
        await one_agent(base_src)  # warm the bytecode caches of both sides
        await one_agent(ours)
        rows: list[tuple[dict[str, float], dict[str, float]]] = []
        for trial in range(trials):
            if trial % 2:
                mine, base = await one_agent(ours), await one_agent(base_src)
            else:
                base, mine = await one_agent(base_src), await one_agent(ours)
            rows.append((base, mine))
    report: dict[str, object] = {"base": rev, "trials": trials, "allocate_calls": CALLS}
    for key in rows[0][0]:
        report[key] = {
            "base": round(statistics.median(b[key] for b, _ in rows), 4),
            "this": round(statistics.median(m[key] for _, m in rows), 4),
            "ratio": round(statistics.median(m[key] / b[key] for b, m in rows), 3),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.revisions", description=__doc__.split("\n")[0])
    parser.add_argument("rev", help="the git revision to compare against, such as main")
    parser.add_argument("--trials", type=int, default=4)
    args = parser.parse_args(argv)
    quiet_logs()
    report = asyncio.run(compare(args.rev, args.trials))
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
