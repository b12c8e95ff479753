"""The agent's per-container series over a window, read back as core.advice facts.

First a count (more than Limits.max_series container series is refused before anything
large is asked), then one instant query per fact (share, GPU memory, the agent's peak,
an enforced limit, the owner from kube-state-metrics' kube_pod_owner). Memory and
utilisation are sampled at the step by Prometheus itself and come back counted: for
each series, how many steps had each value (memory in MiB, utilisation in percent),

    sum_over_time(count_values by (<series>) ("v", round(<sample at the step>))[L:step])

asked for consecutive pieces of the window, each of at most Limits.max_samples samples
(series x steps), whose counts add up. So 1,000 containers over 7 days at 30 s (40
million samples) cross the wire as a few hundred thousand counts, and every sample
still counts once.
"""

from __future__ import annotations

import math

from gpuslice.adapters.prometheus.api import Labels, PrometheusApi, PrometheusError
from gpuslice.core.advice import MIB, Series, SeriesFacts

USED = "gpuslice_container_gpu_memory_used_bytes"
UTIL = "gpuslice_container_gpu_utilization_ratio"
SHARE = "gpuslice_container_gpu_allocated_ratio"
PEAK = "gpuslice_container_gpu_memory_peak_bytes"
LIMIT = "gpuslice_container_gpu_memory_limit_bytes"  # where memory isolation reports one
GPU_MEMORY = "gpuslice_gpu_memory_total_bytes"
OWNER = "kube_pod_owner"  # kube-state-metrics
_KEY = ("namespace", "pod", "container", "resource", "modelName", "UUID")
SERIES = ", ".join(_KEY)


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
        """Its finite values (NaN and Inf: as if absent)."""
        found = ((_series(m), _number(v, query)) for m, v in api.instant(query, end))
        return [(s, v) for s, v in found if math.isfinite(v)]

    for s, v in each(f"last_over_time({SHARE}{sel}[{w}])"):
        if 0 < v <= 1:
            _facts(facts, s).share = v
    for s, v in each(f"min_over_time({SHARE}{sel}[{w}])"):
        if 0 < v <= 1:
            _facts(facts, s).smallest_share = v
    for query in (f"max_over_time({PEAK}{sel}[{w}])", f"max_over_time({USED}{sel}[{w}])"):
        for s, v in each(query):
            f = _facts(facts, s)
            f.peak = v if f.peak is None else max(f.peak, v)
    for s, v in each(f"max_over_time({LIMIT}{sel}[{w}])"):
        _facts(facts, s).limit = v
    step = _dur(step_s)
    sampled = (
        (f"round(max_over_time({USED}{sel}[{step}]) / {MIB})", "memory", MIB),  # peaks too
        (f"round(100 * avg_over_time({UTIL}{sel}[{step}]))", "utilization", 0.01),
    )
    by_labels: dict[tuple[str, ...], SeriesFacts] = {}  # many counts per series
    for expr, into, unit in sampled:
        for piece in _pieces(end, window_s, step_s, count, api.limits.max_samples):
            query = (
                f'sum_over_time(count_values by ({SERIES}) ("v", {expr})[{_dur(piece[1])}:{step}])'
            )
            for m, times in api.instant(query, piece[0]):
                key = tuple(m.get(k, "") for k in _KEY)
                found = by_labels.get(key) or by_labels.setdefault(key, _facts(facts, _series(m)))
                value = _number(m.get("v", ""), query) * unit
                getattr(found, into).add(value, _count(times, query))
    query = f"max by (UUID) (max_over_time({GPU_MEMORY}[{w}]))"
    memory = {s.gpu: v for s, v in each(query) if v > 0}
    owners = _owners(api, end, sel, w)
    for s, f in facts.items():
        f.gpu_memory = memory.get(s.gpu)
        f.owner = owners.get((s.namespace, s.pod))
    return facts


def _pieces(
    end: float, window_s: float, step_s: float, series: int, max_samples: int
) -> list[tuple[float, float]]:
    """(evaluation time, length) of consecutive pieces covering the window, each of at
    most max_samples samples. Their ends sit half a step off the step's grid (where a
    subquery evaluates), so no evaluation falls on the boundary of two pieces."""
    steps = max(1, max_samples // max(1, series))
    length = steps * step_s
    last = (math.floor(end / step_s) + 0.5) * step_s
    if last > end:
        last -= step_s
    first = last - window_s
    out = []
    t = last
    while t > first:
        out.append((t, min(length, t - first)))
        t -= length
    return out


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


def _count(text: str, query: str) -> int:
    value = _number(text, query)
    if not (math.isfinite(value) and 0 <= value <= 1 << 40 and value == int(value)):
        raise PrometheusError(f"a count of {query} is not a count: {text[:40]!r}")
    return int(value)


def _dur(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
