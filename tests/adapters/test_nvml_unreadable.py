"""One GPU NVML cannot read never takes the node's other GPUs down."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
from nvml_fakes import FakeNvml, open_backend
from structlog.testing import capture_logs

from gpuslice.adapters.fake import load_spec
from gpuslice.core.devices import HardwareSnapshot, HealthEvent
from gpuslice.core.errors import BackendError

LOST = pynvml.NVML_ERROR_GPU_IS_LOST


def without(snapshot: HardwareSnapshot, index: int) -> HardwareSnapshot:
    return replace(snapshot, gpus=tuple(g for g in snapshot.gpus if g.index != index))


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"])
def test_a_gpu_that_cannot_be_named_is_left_out_and_the_others_served(
    call: str, tmp_path: Path
) -> None:
    expected = load_spec("t4x4")
    fake = FakeNvml(expected, faults={(call, 1): LOST})
    with capture_logs() as logs:
        backend = open_backend(fake, tmp_path)
        snapshot = backend.snapshot()
    assert snapshot == without(expected, 1)
    assert backend.watched_gpus == tuple(g.uuid for g in snapshot.gpus)
    left_out = [e for e in logs if e["event"] == "gpu_left_out"]
    assert [(e["gpu_index"], e["error"]) for e in left_out] == [(1, "GPU 1: GPU is lost")]
    assert backend.wait_event(0.05) is None, "nothing to mark: the GPU is not served"


def test_a_gpu_read_in_part_is_served_reported_lost_and_probes_fail_until_read_in_full(
    tmp_path: Path,
) -> None:
    expected = load_spec("t4x4")
    fake = FakeNvml(expected, faults={("nvmlDeviceGetMemoryInfo", 2): LOST})
    backend = open_backend(fake, tmp_path)
    snapshot = backend.snapshot()
    full = expected.gpus[2]
    assert snapshot.gpus[2] == replace(
        full,
        memory_mib=0,
        brand="",
        architecture="",
        multiprocessors=0,
        read_error="GPU 2: GPU is lost",
    )
    assert without(snapshot, 2) == without(expected, 2)
    assert backend.wait_event(1.0) == HealthEvent(
        full.uuid, "lost", detail="unreadable: GPU 2: GPU is lost"
    )
    backend.snapshot()
    assert backend.wait_event(0.05) is None, "reported once while it stays unreadable"

    del fake.faults[("nvmlDeviceGetMemoryInfo", 2)]
    assert not backend.probe(full.uuid), "answers, but the snapshot still lacks its facts"
    assert backend.snapshot() == expected
    assert backend.probe(full.uuid)


def test_a_mig_enabled_gpu_whose_mig_devices_cannot_be_read_is_left_out(tmp_path: Path) -> None:
    expected = load_spec("a100-40gb-mig-mixed")
    faults = {("nvmlDeviceGetMigDeviceHandleByIndex", 0): pynvml.NVML_ERROR_UNKNOWN}
    backend = open_backend(FakeNvml(expected, faults=faults), tmp_path)
    assert backend.snapshot() == without(expected, 0)
    assert backend.wait_event(0.05) is None


def test_a_gpu_on_a_switched_node_keeps_its_nvlink_peers_when_another_is_left_out(
    tmp_path: Path,
) -> None:
    expected = load_spec("dgx-a100")
    faults = {("nvmlDeviceGetHandleByIndex", 3): LOST}
    backend = open_backend(FakeNvml(expected, switch_links=12, faults=faults), tmp_path)
    gone = expected.gpus[3].uuid
    kept = tuple(
        replace(g, nvlinks=tuple(p for p in g.nvlinks if p[0] != gone))
        for g in expected.gpus
        if g.index != 3
    )
    assert backend.snapshot() == replace(expected, gpus=kept)


def test_no_readable_gpu_is_a_one_line_backend_error_naming_each(tmp_path: Path) -> None:
    expected = load_spec("t4x4")
    faults = {("nvmlDeviceGetHandleByIndex", i): LOST for i in (0, 1)}
    faults |= {("nvmlDeviceGetMemoryInfo", i): LOST for i in (2, 3)}
    backend = open_backend(FakeNvml(expected, faults=faults), tmp_path)
    with pytest.raises(BackendError) as caught:
        backend.snapshot()
    assert str(caught.value) == (
        "NVML: no GPU could be read (GPU 0: GPU is lost; GPU 1: GPU is lost; "
        "GPU 2: GPU is lost; GPU 3: GPU is lost)"
    )
    assert caught.value.transient


def test_a_node_without_gpus_is_an_empty_snapshot(tmp_path: Path) -> None:
    backend = open_backend(FakeNvml(replace(load_spec("t4"), gpus=())), tmp_path)
    assert backend.snapshot().gpus == ()
