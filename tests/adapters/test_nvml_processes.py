"""NvmlBackend.processes over a stand-in NVML: what each per-process call gives, merged,
per MIG device, and errors kept on their GPU."""

from __future__ import annotations

from pathlib import Path

import pynvml
from nvml_fakes import FakeNvml, open_backend

from gpuslice.adapters.fake import load_spec
from gpuslice.core.usage import GpuSample, ProcessUse

MIB = 1024 * 1024


def uses(gpu: GpuSample) -> dict[int, ProcessUse]:
    return {p.pid: p for d in gpu.devices for p in d.processes}


def test_compute_mps_and_graphics_processes_merge_with_their_sm_utilisation(
    tmp_path: Path,
) -> None:
    fake = FakeNvml(load_spec("t4x4"))
    backend = open_backend(fake, tmp_path)
    t4 = fake.snap.gpus[0].uuid
    fake.run(t4, 100, 1000, sm=40)
    fake.run(t4, 101, 500, kind="mps")
    fake.run(t4, 102, 64, sm=5, kind="graphics")
    gpu = backend.processes().gpus[0]
    assert uses(gpu) == {
        100: ProcessUse(100, 1000 * MIB, 0.4),
        101: ProcessUse(101, 500 * MIB, 0.0),  # used nothing since the last sample
        102: ProcessUse(102, 64 * MIB, 0.05),
    }
    assert gpu.memory_used_bytes == 1564 * MIB
    assert gpu.utilisation == 0.45


def test_utilisation_is_asked_since_the_newest_timestamp_seen(tmp_path: Path) -> None:
    fake = FakeNvml(load_spec("t4"))
    backend = open_backend(fake, tmp_path)
    t4 = fake.snap.gpus[0].uuid
    fake.run(t4, 100, 10, sm=20)
    backend.processes()
    backend.processes()
    (first, seen), (_, since) = fake.util_calls
    assert (first, seen) == (t4, 0)
    assert since > 0


def test_mig_devices_are_read_through_their_own_handles_without_utilisation(
    tmp_path: Path,
) -> None:
    fake = FakeNvml(load_spec("a100-40gb-mig-mixed"))
    backend = open_backend(fake, tmp_path)
    mig = fake.snap.gpus[0].mig_devices[1]
    fake.run(mig.uuid, 300, 2048, sm=90)
    gpu = backend.processes().gpus[0]
    device = next(d for d in gpu.devices if d.uuid == mig.uuid)
    assert device.processes == (ProcessUse(300, 2048 * MIB, None),)
    assert device.util_absent == "mig"
    assert (gpu.utilisation, gpu.util_absent) == (None, "mig")


def test_one_failing_gpu_keeps_its_error_and_the_others_are_sampled(tmp_path: Path) -> None:
    fake = FakeNvml(load_spec("t4x4"))
    backend = open_backend(fake, tmp_path)
    backend.snapshot()
    fake.faults[("nvmlDeviceGetComputeRunningProcesses", 1)] = pynvml.NVML_ERROR_UNKNOWN
    fake.run(fake.snap.gpus[2].uuid, 7, 100)
    sample = backend.processes()
    assert "GPU 1" in sample.gpus[1].error
    assert sample.gpus[1].devices == ()
    assert uses(sample.gpus[2]) == {7: ProcessUse(7, 100 * MIB, 0.0)}
    assert [g.error for g in sample.gpus] == ["", sample.gpus[1].error, "", ""]


def test_a_lost_gpu_is_an_error_on_its_sample_only(tmp_path: Path) -> None:
    fake = FakeNvml(load_spec("t4x4"))
    backend = open_backend(fake, tmp_path)
    fake.lose(3)
    sample = backend.processes()
    assert sample.gpus[3].error
    assert not any(g.error for g in sample.gpus[:3])


def test_unsupported_process_utilisation_is_absent_with_its_reason(tmp_path: Path) -> None:
    fake = FakeNvml(load_spec("t4"))
    fake.faults[("nvmlDeviceGetProcessUtilization", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = open_backend(fake, tmp_path)
    fake.run(fake.snap.gpus[0].uuid, 5, 10, sm=50)
    (device,) = backend.processes().gpus[0].devices
    assert device.util_absent == "unsupported"
    assert device.processes == (ProcessUse(5, 10 * MIB, None),)
