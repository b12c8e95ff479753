"""MIG profiles, placements, mode and instances read through NVML on a real GPU (skipped
where NVML does not load, or no GPU can do MIG).

Reads only: these tests never change a GPU's MIG mode or layout, so they are safe on a
lent GPU. tests/adapters/test_mig_gpu_read_only.py runs them against a recording MIG
control and fails on any create, destroy or mode change."""

from __future__ import annotations

import pytest

from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.core.devices import Gpu
from gpuslice.core.mig import MEMORY_SLICES, MigError, split_profile
from gpuslice.core.ports import MigControl

pytestmark = pytest.mark.gpu


def mig_capable(backend: NvmlBackend) -> tuple[MigControl, list[Gpu]]:
    capable = [g for g in backend.snapshot().gpus if g.mig_capable]
    mig = backend.mig_control()
    if not capable or mig is None:
        pytest.skip("no MIG-capable GPU here")
    return mig, capable


def readable(call: str, read: object) -> None:
    """Skip where reading MIG state needs a privileged user here."""
    if isinstance(read, MigError) and read.code == "NO_PERMISSION":
        pytest.skip(f"{call} needs a privileged user here: {read}")


def test_each_mig_capable_gpu_reports_profiles_with_placements(backend: NvmlBackend) -> None:
    mig, capable = mig_capable(backend)
    for gpu in capable:
        try:
            profiles = mig.profiles(gpu.uuid)
        except MigError as exc:
            readable("reading placements", exc)
            raise
        assert profiles, f"GPU {gpu.index} ({gpu.name}) reports no MIG profile"
        largest = max(profiles, key=lambda p: p.slices)
        assert largest.placements == (largest.placements[0],)
        assert largest.placements[0].start == 0
        assert largest.placements[0].size == MEMORY_SLICES
        for p in profiles:
            assert p.placements, f"{p.name} has no placement"
            assert all(x.start >= 0 and x.end <= MEMORY_SLICES for x in p.placements)
            assert 0 < p.memory_mib <= gpu.memory_mib
            assert 0 < p.multiprocessors <= gpu.multiprocessors
            assert p.instance_count >= 1
        print(gpu.name, hex(gpu.pci_device_id), gpu.architecture, mig.mig_mode(gpu.uuid))
        for p in sorted(profiles, key=lambda p: p.gi_profile_id):
            starts = ",".join(str(x.start) for x in p.placements)
            print(
                f"  {p.name} id={p.gi_profile_id} mib={p.memory_mib} sms={p.multiprocessors}"
                f" slices={p.slices} count={p.instance_count} placements={{{starts}}}:"
                f"{p.placements[0].size} engines={p.engines}"
            )


def test_the_mode_and_instances_read_back_unchanged(backend: NvmlBackend) -> None:
    """A MIG-enabled GPU's instances sit at placements of their profiles, and the mode
    and layout read the same before and after reading everything."""
    mig, capable = mig_capable(backend)
    for gpu in capable:
        before = mig.mig_mode(gpu.uuid)
        assert before[0] == gpu.mig_enabled
        try:
            profiles = {p.name: p for p in mig.profiles(gpu.uuid)}
            instances = mig.instances(gpu.uuid) if gpu.mig_enabled else ()
        except MigError as exc:
            readable("reading MIG instances", exc)
            raise
        for instance in instances:
            spec = profiles[split_profile(instance.profile)[0]]
            assert instance.placement in spec.placements, instance
        print(
            gpu.name,
            "mode",
            before,
            "instances",
            [(i.profile, str(i.placement)) for i in instances],
        )
        assert mig.mig_mode(gpu.uuid) == before
        assert (mig.instances(gpu.uuid) if gpu.mig_enabled else ()) == instances
