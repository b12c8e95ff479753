"""The NVML MIG control's reads: profiles with their placements, the GPU instances with
their placements and MIG UUIDs, the mode; an NVML error becomes a MigError with its name.
(Its changes are made only on a real GPU by the reconciler; no test here makes them.)"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from nvml_fakes import FakeNvml, open_backend

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.mig_tables import A100_40GB
from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.core.mig import MigError
from gpuslice.core.ports import MigControl


def control(backend: object) -> MigControl:
    found = backend.mig_control()  # type: ignore[attr-defined]
    assert found is not None
    return found


def test_nvml_reads_what_the_simulated_gpu_holds(tmp_path: Path) -> None:
    simulated = FakeBackend(load_spec("a100-40gb-mig-mixed"))
    gpu0, gpu1 = simulated.snapshot().gpus
    held = control(simulated).instances(gpu0.uuid)
    nv = FakeNvml(simulated.snapshot(), mig_profiles=A100_40GB, mig_instances={gpu0.uuid: held})
    backend = open_backend(nv, tmp_path)
    mig = control(backend)
    assert mig.profiles(gpu0.uuid) == A100_40GB
    assert mig.instances(gpu0.uuid) == held
    assert [i.profile for i in held] == ["2g.10gb", "1g.5gb", "1g.5gb", "3g.20gb"]
    assert (mig.mig_mode(gpu0.uuid), mig.mig_mode(gpu1.uuid)) == ((True, True), (False, False))
    backend.close()


def test_an_nvml_refusal_is_a_mig_error_with_nvmls_name(tmp_path: Path) -> None:
    snapshot = load_spec("a100-40gb")
    denied = {("nvmlDeviceGetGpuInstancePossiblePlacements", 0): pynvml.NVML_ERROR_NO_PERMISSION}
    backend = open_backend(FakeNvml(snapshot, mig_profiles=A100_40GB, faults=denied), tmp_path)
    with pytest.raises(MigError) as caught:
        control(backend).profiles(snapshot.gpus[0].uuid)
    assert caught.value.code == "NO_PERMISSION"
    assert str(caught.value).startswith("placements of GPU-instance profile 19: ")
    with pytest.raises(MigError, match="NOT_FOUND"):
        control(backend).profiles("GPU-absent")
    backend.close()
