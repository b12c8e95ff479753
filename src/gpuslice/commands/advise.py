"""`gpuslice advise`: right-sizing advice from what pods used, read from Prometheus."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections import Counter
from collections.abc import Sequence

from gpuslice.config.prometheus_access import PrometheusAccess
from gpuslice.core.advice import MIB, UNKNOWN, WASTEFUL, Advice, Rules, advise, total_gpus_back
from gpuslice.core.advice_config import propose_config
from gpuslice.core.advice_mig import propose_mig_config
from gpuslice.core.errors import ConfigError
from gpuslice.wiring.commands import mig_profiles, mig_tables, prometheus_facts

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
MAX_WINDOW_S = 90 * 86400
MAX_STEPS = 1_000_000  # per series: 7 days at 30 s is 20,160


def duration_s(flag: str, text: str) -> float:
    """Seconds in "7d", "1h30m", "500ms"; ConfigError naming the flag otherwise."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ConfigError(f'{flag} "{text}": expected a duration such as 7d, 12h, 30s')
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not 0 < seconds <= MAX_WINDOW_S:
        raise ConfigError(f'{flag} "{text}": expected more than 0 and at most 90d')
    return seconds


def run_advise(
    access: PrometheusAccess,
    *,
    window: str,
    step: str,
    min_samples: int,
    namespace: str,
    output: str,
    end: float | None = None,
) -> str:
    window_s, step_s = duration_s("--window", window), duration_s("--step", step)
    if step_s > window_s:
        raise ConfigError(f"--step {step} is longer than --window {window}")
    if window_s / step_s > MAX_STEPS:
        raise ConfigError(f"--window {window} is more than {MAX_STEPS:,} steps of {step}")
    if end is not None and not math.isfinite(end):
        raise ConfigError(f"--end {end}: expected a Unix time")
    now = time.time() if end is None else end
    url = access.url
    facts = prometheus_facts(access, end=now, window_s=window_s, step_s=step_s, namespace=namespace)
    if not facts:
        raise ConfigError(
            f"no gpuslice container series in the last {window} at {url}"
            + (f" in namespace {namespace}" if namespace else "")
            + " (is Prometheus scraping the agents, with per-pod accounting on?)"
        )
    advice = advise(facts, Rules(step_s, min_samples, mig_profiles()))
    if output == "json":
        workloads = [dataclasses.asdict(a) for a in advice]
        return json.dumps(
            {"window": window, "step": step, "workloads": workloads,
             "gpus_back": total_gpus_back(advice)},
            indent=2, allow_nan=False,
        )  # fmt: skip
    if output == "config":
        return propose_config(advice)
    if output == "mig-config":
        return propose_mig_config(advice, mig_tables())
    return render_table(advice)


def demo_advice(pods: int = 8) -> str:
    """The advice table over a synthetic Prometheus (the testing kit's) holding a day of
    `pods` containers' series on A100s: the shape of what `advise` prints."""
    from gpuslice.testing.prometheus import SyntheticPrometheus

    with SyntheticPrometheus(pods) as fake:
        table = run_advise(PrometheusAccess(fake.url), window="1d", step="30s", min_samples=120,
                           namespace="", output="table", end=1_800_000_000)  # fmt: skip
    return (
        f"gpuslice advise over a synthetic Prometheus: {pods} pods' series, one day at 30 s\n\n"
        + table
    )


def render_table(advice: Sequence[Advice]) -> str:
    head = ("WORKLOAD", "PODS", "HOLDS", "MEMORY P95/MAX", "UTIL P95", "SAMPLES", "FITS/GPU",
            "MIG", "LIMIT", "VERDICT")  # fmt: skip
    rows = [head, *(_row(a) for a in advice)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if any(a.grouped_by != "owner" for a in advice):
        lines.append("* grouped by the pods' name prefix: no owner known (kube_pod_owner)")
    for a in advice:
        lines.extend(f"! {_name(a)}: {note}" for note in a.notes)
    verdicts = Counter(a.verdict for a in advice)
    lines.append(
        f"{len(advice)} workloads: "
        + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
        + f"; {total_gpus_back(advice):g} GPUs could be given back"
    )
    return "\n".join(lines)


def _name(a: Advice) -> str:
    return f"{a.namespace}/{a.workload}/{a.container}" + ("" if a.grouped_by == "owner" else "*")


def _row(a: Advice) -> tuple[str, ...]:
    model = (a.model or "?").removeprefix("NVIDIA ")
    holds = f"{a.resource.removeprefix('nvidia.com/')} {_share(a.share)} of {model}"
    holds += f" ({_mib(a.gpu_memory)})"
    memory = f"{_mib(a.memory_p95, False)}/{_mib(a.memory_max)}"
    util = "n/a" if a.utilization_p95 is None else f"{a.utilization_p95:.0%}"
    samples = f"{a.samples} ({a.hours:.1f} h)"
    if a.replicas is None:
        fits = "?"
    else:
        bare = f" ({a.replicas_bare} bare)" if a.replicas_bare != a.replicas else ""
        fits = f"{a.replicas}{bare}"
    mig = a.mig_profile or "-"
    limit = "-" if a.memory_limit is None else f"{_mib(a.memory_limit)} ({a.limit_source})"
    verdict = a.verdict
    if a.verdict == WASTEFUL:
        verdict += f", {a.gpus_back:g} GPU back"
    elif a.verdict == UNKNOWN:
        verdict += " (see !)"
    return (_name(a), str(a.pods), holds, memory, util, samples, fits, mig, limit, verdict)


def _share(share: float | None) -> str:
    if share is None:
        return "no share"
    replicas = round(1 / share) if share > 0 else 0
    return "a whole GPU" if replicas == 1 else f"1/{replicas}" if replicas else f"{share:g}"


def _mib(value: float | None, unit: bool = True) -> str:
    if value is None:
        return "?"
    return f"{value / MIB:,.0f}" + (" MiB" if unit else "")
