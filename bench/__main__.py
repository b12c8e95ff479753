"""`python -m bench [--quick] [--output FILE] [--only GROUP ...]`: run the benchmarks.

Prints one JSON object on stdout (and writes it to --output), a short table on
stderr. Exits 1 when a figure could not be measured; a missed target is reported
in the JSON (`met`) but is not a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench import (
    advise,
    api_restart,
    configmap,
    dra,
    events,
    fleet,
    fleet_start,
    isolation,
    listing,
    memory,
    metrics_auth,
    mig_apply,
    reconfig,
    roll,
    rpc,
    sampling,
    startup,
    upgrade,
)
from bench.harness import Figure, failed, table
from bench.plan import FULL, QUICK, Plan
from bench.rigs import REPO, quiet_logs

Group = tuple[tuple[str, ...], Callable[[Plan], Awaitable[list[Figure]]]]
GROUPS: dict[str, Group] = {
    "rpc": (rpc.FIGURES, rpc.run),
    "events": (events.FIGURES, events.run),
    "listing": (listing.FIGURES, listing.run),
    "reconfig": (reconfig.FIGURES, reconfig.run),
    "configmap": (configmap.FIGURES, configmap.run),
    "startup": (startup.FIGURES, startup.run),
    "memory": (memory.FIGURES, memory.run),
    "sampling": (sampling.FIGURES, sampling.run),
    "dra": (dra.FIGURES, dra.run),
    "upgrade": (upgrade.FIGURES, upgrade.run),
    "roll": (roll.FIGURES, roll.run),
    "metrics_auth": (metrics_auth.FIGURES, metrics_auth.run),
    "advise": (advise.FIGURES, advise.run),
    "isolation": (isolation.FIGURES, isolation.run),
    "fleet": (fleet.FIGURES, fleet.run),
    "fleet_start": (fleet_start.FIGURES, fleet_start.run),
    "api_restart": (api_restart.FIGURES, api_restart.run),
    "mig_apply": (mig_apply.FIGURES, mig_apply.run),
}
DEFAULT_OUTPUT = REPO / "bench" / "results" / "latest.json"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a reduced run (seconds), for CI")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON")
    ap.add_argument(
        "--only", action="append", choices=sorted(GROUPS), help="run only this group (repeatable)"
    )
    return ap.parse_args(argv)


async def run_groups(plan: Plan, names: list[str]) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = {}
    for group in names:
        wanted, run = GROUPS[group]
        print(f"bench: {group} ...", file=sys.stderr, flush=True)
        try:
            produced = {f.name: f.as_json() for f in await run(plan)}
            error = "not produced"
        except Exception as exc:  # one broken group must not hide the others' figures
            produced, error = {}, f"{type(exc).__name__}: {exc}"
        for name in wanted:
            figures[name] = produced.get(name) or failed(name, error)
    return figures


def report(plan: Plan, figures: dict[str, dict[str, Any]], started: float) -> dict[str, Any]:
    return {
        "suite": "gpuslice bench",
        "plan": plan.name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "grpcio": grpc.__version__,
            "platform": platform.platform(),
        },
        "all_measured": all(f.get("value") is not None for f in figures.values()),
        "all_met": all(f["met"] for f in figures.values()),
        "figures": figures,
    }


def main(argv: list[str]) -> int:
    args = parse(argv)
    plan = QUICK if args.quick else FULL
    quiet_logs()
    started = time.monotonic()
    figures = asyncio.run(run_groups(plan, args.only or list(GROUPS)))
    result = report(plan, figures, started)
    text = json.dumps(result, indent=2)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text + "\n", encoding="utf-8")
    print(text)
    print(table(figures), file=sys.stderr)
    return 0 if result["all_measured"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
