"""MIG profiles and placements read through NVML on a real GPU (skipped elsewhere).

Reads only: this test never changes a GPU's MIG mode or layout."""

from __future__ import annotations

import pytest

from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.core.mig import MEMORY_SLICES, MigError

pytestmark = pytest.mark.gpu


def test_each_mig_capable_gpu_reports_profiles_with_placements(backend: NvmlBackend) -> None:
    capable = [g for g in backend.snapshot().gpus if g.mig_capable]
    if not capable:
        pytest.skip("no MIG-capable GPU here")
    mig = backend.mig_control()
    for gpu in capable:
        try:
            profiles = mig.profiles(gpu.uuid)
        except MigError as exc:
            if exc.code == "NO_PERMISSION":
                pytest.skip(f"reading placements needs a privileged user here: {exc}")
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
