"""What a MIG layout plan would leave on a GPU, without running it: the GPU with its mode
and MIG devices once the plan's steps are made. A device to be created has no UUID yet: it
gets a stand-in naming its placement, and the next free GPU-instance id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuslice.core.devices import Gpu, MigDevice
from gpuslice.core.mig import MigProfileSpec, split_profile
from gpuslice.core.mig_layout import Create, Destroy, GpuPlan, SetMode


def gpu_after(gpu: Gpu, plan: GpuPlan, profiles: Sequence[MigProfileSpec]) -> Gpu:
    """`gpu` as it would be once `plan` is made (unchanged where the plan has no step)."""
    if not plan.steps:
        return gpu
    gone = {s.gi for s in plan.steps if isinstance(s, Destroy)}
    modes = [s.enabled for s in plan.steps if isinstance(s, SetMode)]
    enabled = modes[-1] if modes else gpu.mig_enabled
    devices = [d for d in gpu.mig_devices if d.gi not in gone] if enabled else []
    by_name = {p.name: p for p in profiles}
    for step in plan.steps:
        if isinstance(step, Create):
            used = {d.gi for d in devices}
            gi = min(set(range(len(used) + 1)) - used)
            devices.append(_new_device(gpu, step, gi, by_name[split_profile(step.profile)[0]]))
    numbered = tuple(replace(d, index=n) for n, d in enumerate(devices))
    return replace(gpu, mig_enabled=enabled, mig_devices=numbered)


def _new_device(gpu: Gpu, step: Create, gi: int, spec: MigProfileSpec) -> MigDevice:
    _, compute, slices = split_profile(step.profile)
    return MigDevice(
        uuid=f"MIG-new-{gpu.uuid.removeprefix('GPU-')}-{step.placement.start}",
        index=0,
        profile=step.profile,
        gi=gi,
        ci=0,
        memory_mib=spec.memory_mib,
        multiprocessors=spec.multiprocessors * compute // slices,
        gi_slices=slices,
        ci_slices=compute,
        engines=spec.engines,
    )
