"""The real NVML backend on a machine with an NVIDIA GPU (skipped elsewhere)."""

from __future__ import annotations

import time

import pytest

from gpuslice.adapters.nvml import NvmlBackend

pytestmark = pytest.mark.gpu


def test_every_gpu_is_registered_for_health_events(backend: NvmlBackend) -> None:
    gpus = backend.snapshot().gpus
    assert gpus, "NVML loaded but reports no GPU"
    assert set(backend.watched_gpus) == {g.uuid for g in gpus}


def test_a_healthy_gpu_sends_no_event_within_the_timeout(backend: NvmlBackend) -> None:
    started = time.monotonic()
    assert backend.wait_event(0.2) is None
    assert 0.15 <= time.monotonic() - started < 2.0


def test_versions_are_reported(backend: NvmlBackend) -> None:
    snapshot = backend.snapshot()
    assert snapshot.driver_version
    assert snapshot.nvml_version
    assert snapshot.cuda_driver_version >= 11000
    assert snapshot.nvml_version.endswith(snapshot.driver_version)


def test_each_gpu_answers_a_probe_and_reads_its_facts(backend: NvmlBackend) -> None:
    for gpu in backend.snapshot().gpus:
        assert backend.probe(gpu.uuid)
        assert gpu.memory_mib > 0
        assert gpu.compute_capability >= (3, 0)
        assert gpu.architecture
        assert gpu.brand
