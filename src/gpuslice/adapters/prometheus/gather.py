"""The agent's per-container series over a window, read back as core.advice facts.

First a count (more than Limits.max_series container series is refused before anything
large is asked), then one instant query per fact (share, GPU memory, the agent's peak,
an enforced limit, the owner from kube-state-metrics' kube_pod_owner), then memory and
utilisation as range queries in bounded pieces. Each piece's values are counted (most
repeat) before they become numbers, so 1,000 containers over 7 days stay cheap.
"""

from __future__ import annotations

import math
from collections import Counter
from operator import itemgetter

from gpuslice.adapters.prometheus.api import Labels, PrometheusApi, PrometheusError
from gpuslice.core.advice import Series, SeriesFacts

USED = "gpuslice_container_gpu_memory_used_bytes"
UTIL = "gpuslice_container_gpu_utilization_ratio"
SHARE = "gpuslice_container_gpu_allocated_ratio"
PEAK = "gpuslice_container_gpu_memory_peak_bytes"
LIMIT = "gpuslice_container_gpu_memory_limit_bytes"  # where memory isolation reports one
GPU_MEMORY = "gpuslice_gpu_memory_total_bytes"
OWNER = "kube_pod_owner"  # kube-state-metrics


def gather(
    api: PrometheusApi, end: float, window_s: float, step_s: float, namespace: str = ""
) -> dict[Series, SeriesFacts]:
    sel = f"{{namespace={_quote(namespace)}}}" if namespace else ""
    w = _dur(window_s)
    count = api.scalar_count(f"count(last_over_time({USED}{sel}[{w}]))", end)
    if count > api.limits.max_series:
        raise PrometheusError(
            f"{count} container series in the window, more than the {api.limits.max_series} "
            "one advice reads; narrow it with --namespace"
        )
    facts: dict[Series, SeriesFacts] = {}
    if not count:
        return facts

    def each(query: str) -> list[tuple[Series, float]]:
        return [(_series(m), _number(v, query)) for m, v in api.instant(query, end)]

    for s, v in each(f"last_over_time({SHARE}{sel}[{w}])"):
        _facts(facts, s).share = v
    for s, v in each(f"min_over_time({SHARE}{sel}[{w}])"):
        _facts(facts, s).smallest_share = v
    for s, v in each(f"max_over_time({PEAK}{sel}[{w}])"):
        _facts(facts, s).peak = v
    for s, v in each(f"max_over_time({LIMIT}{sel}[{w}])"):
        _facts(facts, s).limit = v
    start = end - window_s
    ranges = (
        (f"max_over_time({USED}{sel}[{_dur(step_s)}])", "memory"),  # peaks between steps too
        (f"avg_over_time({UTIL}{sel}[{_dur(step_s)}])", "utilization"),
    )
    for query, into in ranges:
        for piece in api.range(query, start, end, step_s, count):
            for metric, values in piece:
                dist = getattr(_facts(facts, _series(metric)), into)
                for text, times in Counter(map(itemgetter(1), values)).items():
                    dist.add(_number(text, query), times)
    memory = {m.get("UUID", ""): _number(v, GPU_MEMORY) for m, v in api.instant(
        f"max by (UUID) (max_over_time({GPU_MEMORY}[{w}]))", end)}  # fmt: skip
    owners = _owners(api, end, sel, w)
    for s, f in facts.items():
        f.gpu_memory = memory.get(s.gpu)
        f.owner = owners.get((s.namespace, s.pod))
    return facts


def _owners(api: PrometheusApi, end: float, sel: str, w: str) -> dict[tuple[str, str], str]:
    query = (
        f"max by (namespace, pod, owner_kind, owner_name) (last_over_time({OWNER}[{w}]) "
        f"and on (namespace, pod) group by (namespace, pod) (last_over_time({USED}{sel}[{w}])))"
    )
    out: dict[tuple[str, str], str] = {}
    for m, _ in api.instant(query, end):
        kind, name = m.get("owner_kind", ""), m.get("owner_name", "")
        if name and name != "<none>":
            out[(m.get("namespace", ""), m.get("pod", ""))] = f"{kind}/{name}"
    return out


def _facts(facts: dict[Series, SeriesFacts], series: Series) -> SeriesFacts:
    found = facts.get(series)
    if found is None:
        found = facts[series] = SeriesFacts()
    return found


def _series(m: Labels) -> Series:
    return Series(
        m.get("namespace", ""), m.get("pod", ""), m.get("container", ""),
        m.get("resource", ""), m.get("modelName", ""), m.get("UUID", ""),
    )  # fmt: skip


def _number(text: str, query: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise PrometheusError(f"a value of {query} is not a number: {text[:40]!r}") from None


def _dur(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
