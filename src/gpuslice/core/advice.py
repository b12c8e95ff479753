"""Right-sizing: per-workload advice from the samples of what its containers used.

Pure rules over samples a reader has gathered: each container's series on one GPU (its
memory and utilisation samples, the share it holds, the GPU's memory, the agent's own
peak) joins its workload, and each workload gets what it holds, what it used, what
would fit and a verdict. HEADROOM is the margin kept above a peak: a share within it of
the peak is over-packed (the chart's alert fires on the same 10 %).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuslice.core.advice_stats import Distribution

HEADROOM = 0.10
MIB = 1024 * 1024
MAX_REPLICAS = 1024  # the config's own bound
MIG_RESOURCE = "nvidia.com/mig-"
OVER, FITS, WASTEFUL, UNKNOWN = "over-packed", "fits", "wasteful", "unknown"
# The generated tails of a pod name: a ReplicaSet's hash and the pod's own 5 characters,
# a StatefulSet's ordinal, a Job's suffix. The chart's recording rules strip the same.
_POD_SUFFIX = re.compile(r"(?:-[a-z0-9]{6,10})?(?:-[a-z0-9]{5}|-[0-9]+)$")


@dataclass(frozen=True, slots=True, order=True)
class Series:
    """One container on one GPU, as the agent's series label it."""

    namespace: str
    pod: str
    container: str
    resource: str
    model: str
    gpu: str  # the GPU's UUID


@dataclass(slots=True)
class SeriesFacts:
    memory: Distribution = field(default_factory=Distribution)  # bytes
    utilization: Distribution = field(default_factory=Distribution)  # 0..1
    share: float | None = None  # the allocated ratio, latest in the window
    smallest_share: float | None = None  # the smallest one held in the window
    gpu_memory: float | None = None  # bytes
    peak: float | None = None  # the most it used: the agent's peak series, the samples' max
    limit: float | None = None  # an enforced memory limit, where isolation reports one
    owner: str | None = None  # "kind/name", from kube_pod_owner


@dataclass(frozen=True, slots=True)
class Rules:
    step_s: float  # seconds each sample stands for
    min_samples: int  # fewer: too few to judge
    # GPU model -> MIG profile -> memory in MiB (what the simulated hardware knows)
    mig_profiles: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Advice:
    namespace: str
    workload: str
    grouped_by: str  # "owner" or "name prefix"
    container: str
    resource: str
    model: str
    pods: int
    share: float | None  # the share of the GPU each holds (the most common one)
    gpu_memory: float | None
    device_memory: float | None  # of what is replicated: the GPU, or its MIG device
    samples: int
    hours: float
    memory_p95: float | None
    memory_max: float | None
    utilization_p95: float | None
    replicas: int | None  # per GPU, with HEADROOM above the peak
    replicas_bare: int | None  # per GPU, without it
    mig_profile: str | None
    mig_note: str
    memory_limit: float | None
    limit_source: str  # "enforced" (a series says so), "recommended" or ""
    verdict: str
    gpus_back: float
    notes: tuple[str, ...]

    @property
    def current_replicas(self) -> int | None:
        if not (self.share and self.gpu_memory and self.device_memory):
            return None
        return max(1, round(self.device_memory / (self.share * self.gpu_memory)))


def workload_of(pod: str, owner: str | None) -> tuple[str, str]:
    """(workload name, how it was found): the owner from the metric labels when known,
    else the pod's name without its generated suffix."""
    if owner:
        return owner, "owner"
    prefix = _POD_SUFFIX.sub("", pod)
    return (prefix or pod), "name prefix"


def advise(facts: Mapping[Series, SeriesFacts], rules: Rules) -> list[Advice]:
    groups: dict[tuple[str, str, str, str, str, str], list[tuple[Series, SeriesFacts]]] = {}
    for series in sorted(facts):
        f = facts[series]
        name, basis = workload_of(series.pod, f.owner)
        key = (series.namespace, name, basis, series.container, series.resource, series.model)
        groups.setdefault(key, []).append((series, f))
    return [_advice(key, members, rules) for key, members in groups.items()]


def replicas_for(peak: float, gpu_memory: float, headroom: float = HEADROOM) -> int:
    """How many replicas of one GPU each hold `peak` (plus `headroom` of it)."""
    if peak <= 0:
        return MAX_REPLICAS
    return min(MAX_REPLICAS, math.floor(gpu_memory / (peak * (1 + headroom))))


def smallest_profile(peak: float, profiles: Mapping[str, int]) -> str | None:
    """The MIG profile with the least memory that holds `peak` plus HEADROOM."""
    fitting = [(mib, name) for name, mib in profiles.items() if mib * MIB >= peak * (1 + HEADROOM)]
    return min(fitting)[1] if fitting else None


def memory_limit(enforced: float | None, gpu_memory: float, replicas: int) -> tuple[float, str]:
    """The limit to enforce per replica: the one isolation already reports, else the
    GPU's memory split by the replicas its peak allows."""
    if enforced is not None:
        return enforced, "enforced"
    return math.floor(gpu_memory / max(1, replicas)), "recommended"


def _advice(
    key: tuple[str, str, str, str, str, str],
    members: list[tuple[Series, SeriesFacts]],
    rules: Rules,
) -> Advice:
    namespace, name, basis, container, resource, model = key
    memory, util = Distribution(), Distribution()
    for _, f in members:
        memory.merge(f.memory)
        util.merge(f.utilization)
    pods = len({s.pod for s, _ in members})
    shares = [f.share for _, f in members if f.share is not None]
    share = max(set(shares), key=shares.count) if shares else None
    gpu_memory = max((f.gpu_memory for _, f in members if f.gpu_memory), default=None)
    peaks = [f.peak for _, f in members if f.peak is not None and math.isfinite(f.peak)]
    # the agent's peak series and the exact maximum of the samples; else the sampled one
    peak = max(peaks, default=memory.max if memory.count else None)
    notes: list[str] = []
    if memory.count < rules.min_samples:
        notes.append(f"too few samples: {memory.count} (fewer than {rules.min_samples})")
    if memory.not_finite or util.not_finite:
        notes.append(f"{memory.not_finite + util.not_finite} samples not finite (NaN/Inf), ignored")
    if not memory.exact:
        notes.append("p95 from bucketed samples (within 0.1 % above)")
    smallest = [f.smallest_share for _, f in members if f.smallest_share is not None]
    if smallest and min(smallest) >= 1:
        notes.append("never ran on a shared GPU: what fits is a projection")
    if share is None:
        notes.append("no share held in the window (not allocated through gpuslice)")
    if gpu_memory is None:
        notes.append(f"GPU memory of {model or 'its GPU'} unknown")
    elif resource.startswith(MIG_RESOURCE) and model not in rules.mig_profiles:
        notes.append(f"MIG profiles of {model or 'its GPU'} unknown: what fits is not said")
    replicas = bare = None
    profile, mig_note, limit, source = None, "", None, ""
    verdict, back = UNKNOWN, 0.0
    device = _device_memory(resource, model, gpu_memory, rules.mig_profiles)
    if peak is not None and gpu_memory and device:
        replicas, bare = replicas_for(peak, device), replicas_for(peak, device, 0.0)
        if replicas < 1:
            what = "a whole GPU" if device == gpu_memory else "its MIG device"
            notes.append(
                f"peak above any share: {_mib(peak)} needs more than {what} "
                f"({_mib(device)}) with {HEADROOM:.0%} headroom"
            )
        profile, mig_note = _mig(peak, model, rules.mig_profiles)
        enforced = max((f.limit for _, f in members if f.limit is not None), default=None)
        limit, source = memory_limit(enforced, device, replicas)
        if share is not None and memory.count >= rules.min_samples:
            verdict, back = _verdict(share, replicas, peak, gpu_memory, device, len(members))
    return Advice(
        namespace=namespace, workload=name, grouped_by=basis, container=container,
        resource=resource, model=model, pods=pods, share=share, gpu_memory=gpu_memory,
        device_memory=device,
        samples=memory.count, hours=memory.count * rules.step_s / 3600,
        memory_p95=memory.quantile(0.95), memory_max=peak,
        utilization_p95=util.quantile(0.95), replicas=replicas, replicas_bare=bare,
        mig_profile=profile, mig_note=mig_note, memory_limit=limit, limit_source=source,
        verdict=verdict, gpus_back=back, notes=tuple(notes),
    )  # fmt: skip


def _verdict(
    share: float, replicas: int, peak: float, gpu_memory: float, device: float, holders: int
) -> tuple[str, float]:
    """over-packed when the share leaves less than HEADROOM above the peak; wasteful when
    more replicas would fit than it has, with the GPUs its holders would give back."""
    if peak * (1 + HEADROOM) > share * gpu_memory:
        return OVER, 0.0
    current = max(1, round(device / (share * gpu_memory)))
    if replicas > current:
        needed = holders * device / gpu_memory / replicas
        return WASTEFUL, math.floor((holders * share - needed) * 100) / 100
    return FITS, 0.0


def _device_memory(
    resource: str, model: str, gpu_memory: float | None, table: Mapping[str, Mapping[str, int]]
) -> float | None:
    """The memory of what a resource replicates: a MIG device of the profile its name
    says (from the table), else the whole GPU."""
    if resource.startswith(MIG_RESOURCE):
        mib = table.get(model, {}).get(resource.removeprefix(MIG_RESOURCE))
        return None if mib is None else mib * MIB
    return gpu_memory


def _mig(peak: float, model: str, table: Mapping[str, Mapping[str, int]]) -> tuple[str | None, str]:
    profiles = table.get(model)
    if not profiles:
        return None, f"no MIG profile known for {model or 'its GPU'}"
    found = smallest_profile(peak, profiles)
    if found is None:
        return None, "no MIG profile holds its peak"
    return found, ""


def total_gpus_back(advice: Iterable[Advice]) -> float:
    return math.floor(sum(a.gpus_back for a in advice) * 100) / 100


def _mib(value: float) -> str:
    return f"{value / MIB:,.0f} MiB"
