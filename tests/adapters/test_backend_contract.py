"""The GpuBackend contract, one suite for every backend.

Run over every built-in fake profile, over NvmlBackend driving a stand-in NVML
library built from each profile (the real adapter code without a GPU), and
over the real NVML backend where a GPU and driver are present (marked gpu).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nvml_fakes import FakeNvml, open_backend

from gpuslice.adapters.fake import FakeBackend, load_spec, profile_names
from gpuslice.adapters.nvml import NvmlBackend
from gpuslice.core.errors import BackendError
from gpuslice.core.ports import GpuBackend

GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")
MIG_UUID = re.compile(r"MIG-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")
MIG_PROFILE = re.compile(r"(\d+c\.)?\d+g\.\d+gb(\+[a-z]+)*")
PCI_BUS_ID = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")
SWITCH_LINKS = {"dgx-a100": 12, "dgx-h100": 18}

BACKENDS = [
    *(pytest.param(f"fake:{name}", id=f"fake-{name}") for name in profile_names()),
    *(pytest.param(f"nvml-standin:{name}", id=f"nvml-standin-{name}") for name in profile_names()),
    pytest.param("nvml", id="nvml-real", marks=pytest.mark.gpu),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GpuBackend]:
    kind, _, name = request.param.partition(":")
    opened: GpuBackend
    if kind == "fake":
        opened = FakeBackend.from_spec(name, str(tmp_path / "events.jsonl"))
    elif kind == "nvml-standin":
        fake = FakeNvml(load_spec(name), switch_links=SWITCH_LINKS.get(name, 0))
        opened = open_backend(fake, tmp_path)
    else:
        try:
            opened = NvmlBackend.open()
        except BackendError as exc:
            pytest.skip(f"NVML does not load here: {exc}")
    yield opened
    opened.close()


def test_gpus_have_unique_uuids_indexes_and_minors(backend: GpuBackend) -> None:
    gpus = backend.snapshot().gpus
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert all(GPU_UUID.fullmatch(g.uuid) for g in gpus)
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert len({g.minor for g in gpus}) == len(gpus)


def test_gpu_facts_are_sane(backend: GpuBackend) -> None:
    snapshot = backend.snapshot()
    assert snapshot.driver_version
    assert snapshot.nvml_version
    for gpu in snapshot.gpus:
        assert gpu.name
        assert gpu.memory_mib > 0
        major, minor = gpu.compute_capability
        assert 3 <= major <= 20
        assert 0 <= minor <= 9
        assert PCI_BUS_ID.fullmatch(gpu.pci_bus_id)
        assert gpu.numa_node is None or gpu.numa_node >= 0
        assert gpu.mig_capable or not gpu.mig_enabled


def test_mig_devices_only_on_mig_enabled_gpus_and_well_formed(backend: GpuBackend) -> None:
    for gpu in backend.snapshot().gpus:
        if not gpu.mig_enabled:
            assert gpu.mig_devices == ()
            continue
        assert [m.index for m in gpu.mig_devices] == list(range(len(gpu.mig_devices)))
        assert len({(m.gi, m.ci) for m in gpu.mig_devices}) == len(gpu.mig_devices)
        for mig in gpu.mig_devices:
            assert MIG_UUID.fullmatch(mig.uuid)
            assert MIG_PROFILE.fullmatch(mig.profile)
            assert 0 < mig.memory_mib <= gpu.memory_mib
            assert len(mig.cap_paths) == 2
            assert all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in mig.cap_paths)


def test_nvlink_peers_exist_and_are_symmetric(backend: GpuBackend) -> None:
    snapshot = backend.snapshot()
    links = {(g.uuid, peer): count for g in snapshot.gpus for peer, count in g.nvlinks}
    for (gpu, peer), count in links.items():
        assert snapshot.gpu_by_uuid(peer) is not None
        assert peer != gpu
        assert count > 0
        assert links.get((peer, gpu)) == count


def test_repeated_snapshots_agree(backend: GpuBackend) -> None:
    assert backend.snapshot() == backend.snapshot()


def test_wait_event_returns_none_after_about_the_timeout(backend: GpuBackend) -> None:
    started = time.monotonic()
    assert backend.wait_event(0.2) is None
    assert 0.15 <= time.monotonic() - started < 2.0


def test_probe_is_true_for_every_healthy_gpu(backend: GpuBackend) -> None:
    assert all(backend.probe(g.uuid) for g in backend.snapshot().gpus)


def test_close_is_idempotent(backend: GpuBackend) -> None:
    backend.close()
    backend.close()
    started = time.monotonic()
    assert backend.wait_event(5.0) is None
    assert time.monotonic() - started < 1.0


def test_processes_cover_every_gpu_and_mig_device_of_the_snapshot(backend: GpuBackend) -> None:
    snapshot = backend.snapshot()
    sample = backend.processes()
    assert [g.uuid for g in sample.gpus] == [g.uuid for g in snapshot.gpus]
    for gpu, got in zip(snapshot.gpus, sample.gpus, strict=True):
        assert got.error == ""
        if gpu.mig_enabled:
            assert [d.uuid for d in got.devices] == [m.uuid for m in gpu.mig_devices]
            assert all(d.util_absent == "mig" for d in got.devices)
            assert got.utilisation is None
        else:
            assert [d.uuid for d in got.devices] == [gpu.uuid]
        assert got.memory_used_bytes is None or got.memory_used_bytes >= 0
        for proc in (p for d in got.devices for p in d.processes):
            assert proc.pid > 0
            assert 0 <= proc.memory_bytes <= gpu.memory_mib * 1024 * 1024
            assert proc.sm_util is None or 0.0 <= proc.sm_util <= 1.0


def test_processes_report_the_node_files_processes(backend: GpuBackend) -> None:
    snapshot = backend.snapshot()
    sample = backend.processes()
    for gpu, got in zip(snapshot.gpus, sample.gpus, strict=True):
        if gpu.processes and not gpu.mig_enabled:
            pids = {p.pid: p.memory_bytes for d in got.devices for p in d.processes}
            assert pids == {p.pid: p.used_mib * 1024 * 1024 for p in gpu.processes}
