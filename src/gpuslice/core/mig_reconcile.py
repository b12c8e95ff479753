"""The MIG layout protocol of the `nvidia.com/mig.config` node label, as NVIDIA's
mig-manager speaks it, decided as a reconcile: from the plans of core.mig_layout, which
GPUs change now, which wait (and why), and the state to publish in
`nvidia.com/mig.config.state`. Also who holds which device, from the kubelet's
allocations, and whether a GPU is idle enough for a mode change that resets it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuslice.core.devices import Gpu, physical_id
from gpuslice.core.mig_layout import GpuPlan, SetMode
from gpuslice.core.usage import ContainerDevices, ProcessSample

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PENDING, SUCCESS, FAILED = "pending", "success", "failed"


@dataclass(frozen=True, slots=True)
class LayoutPass:
    """What one pass decides: the plans to run now, and the state with its reason."""

    run: tuple[GpuPlan, ...]  # GPUs that change now, in index order
    state: str  # PENDING while any GPU must still change, else SUCCESS
    reason: str = ""  # why GPUs wait ("" when none does)


def decide(plans: Sequence[GpuPlan], busy: Iterable[str] = ()) -> LayoutPass:
    """Run every GPU that must change and nothing holds; `busy` (GPU UUIDs with
    processes) holds a GPU whose mode change resets it, which waits until it is idle."""
    busy_set = frozenset(busy)
    run, waiting = [], []
    for plan in sorted(plans, key=lambda p: p.index):
        if not plan.steps:
            continue
        if plan.held:
            waiting.append(plan.held)
        elif plan.uuid in busy_set and any(isinstance(s, SetMode) and s.resets for s in plan.steps):
            waiting.append(
                f"GPU {plan.index}: the MIG mode change resets the GPU, done only once it is "
                "idle; processes run on it"
            )
        else:
            run.append(plan)
    state = PENDING if run or waiting else SUCCESS
    return LayoutPass(tuple(run), state, "; ".join(waiting))


def holders(
    allocations: Iterable[ContainerDevices], gpus: Iterable[Gpu]
) -> dict[str, tuple[str, ...]]:
    """Device UUID (a GPU's or a MIG device's) -> the pods ("namespace/name") the
    kubelet allocated it to, under any resource and in any ID form (replicas, indexes)."""
    lookup: dict[str, str] = {}
    for gpu in gpus:
        lookup[gpu.uuid] = lookup[str(gpu.index)] = gpu.uuid
        for mig in gpu.mig_devices:
            lookup[mig.uuid] = lookup[f"{gpu.index}:{mig.index}"] = mig.uuid
    found: dict[str, set[str]] = defaultdict(set)
    for alloc in allocations:
        for device_id in alloc.device_ids:
            uuid = lookup.get(physical_id(device_id))
            if uuid is not None:
                found[uuid].add(f"pod {alloc.namespace}/{alloc.pod}")
    return {uuid: tuple(sorted(pods)) for uuid, pods in found.items()}


def busy_gpus(sample: ProcessSample) -> frozenset[str]:
    """The GPUs with a process on them or on one of their MIG devices."""
    return frozenset(g.uuid for g in sample.gpus if any(d.processes for d in g.devices))


def state_labels(state: str | None) -> dict[str, str]:
    """The node labels of a state (none before the label names a config)."""
    return {} if state is None else {STATE_LABEL: state}
