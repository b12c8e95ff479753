"""Health event registration: a GPU is never declared healthy unwatched, and one
GPU NVML cannot name never stops the others being watched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pynvml
import pytest
from nvml_fakes import FakeNvml, open_backend

from gpuslice.adapters.fake import load_spec
from gpuslice.core.devices import HealthEvent
from gpuslice.core.health import XidPolicy
from gpuslice.core.health_state import RecoveryPolicy
from gpuslice.core.resources import build_resources
from gpuslice.core.sharing import ResourceSettings
from gpuslice.services.health_monitor import HealthMonitor

XID = pynvml.nvmlEventTypeXidCriticalError
T = TypeVar("T")


def test_a_gpu_whose_registration_failed_fails_probes_until_registration_succeeds(
    tmp_path: Path,
) -> None:
    snapshot = load_spec("t4x4")
    fake = FakeNvml(snapshot, faults={("nvmlDeviceRegisterEvents", 2): pynvml.NVML_ERROR_UNKNOWN})
    backend = open_backend(fake, tmp_path)
    gpu = snapshot.gpus[2].uuid
    event = backend.wait_event(1.0)
    assert event is not None
    assert (event.gpu_uuid, event.kind) == (gpu, "lost")
    assert not backend.probe(gpu), "it answers, but its XIDs would go unseen"
    assert not backend.probe(gpu), "each probe retries, and fails while registration does"
    assert gpu not in backend.watched_gpus

    del fake.faults[("nvmlDeviceRegisterEvents", 2)]
    assert backend.probe(gpu)
    assert gpu in backend.watched_gpus
    fake.fire(2, XID, 79)
    assert backend.wait_event(2.0) == HealthEvent(gpu, "xid", xid=79)
    assert backend.wait_event(0.05) is None, "the retries queued no further lost event"


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"])
def test_a_gpu_unnamed_at_registration_leaves_the_others_watched_and_is_taken_later(
    call: str, tmp_path: Path
) -> None:
    snapshot = load_spec("t4x4")
    fake = FakeNvml(snapshot, faults={(call, 1): pynvml.NVML_ERROR_UNKNOWN})
    backend = open_backend(fake, tmp_path)
    uuids = [g.uuid for g in snapshot.gpus]
    assert backend.watched_gpus == (uuids[0], uuids[2], uuids[3])
    fake.fire(3, XID, 48)
    assert backend.wait_event(2.0) == HealthEvent(uuids[3], "xid", xid=48)

    del fake.faults[(call, 1)]
    assert backend.snapshot() == snapshot
    assert list(backend.watched_gpus) == [uuids[0], uuids[2], uuids[3], uuids[1]]
    fake.fire(1, XID, 79)
    assert backend.wait_event(2.0) == HealthEvent(uuids[1], "xid", xid=79)


def test_a_gpu_first_named_by_a_snapshot_that_cannot_be_registered_is_reported_lost(
    tmp_path: Path,
) -> None:
    snapshot = load_spec("t4x4")
    faults = {("nvmlDeviceGetHandleByIndex", 1): pynvml.NVML_ERROR_UNKNOWN}
    fake = FakeNvml(snapshot, faults=faults)
    backend = open_backend(fake, tmp_path)
    fake.faults = {("nvmlDeviceRegisterEvents", 1): pynvml.NVML_ERROR_UNKNOWN}
    assert backend.snapshot() == snapshot
    event = backend.wait_event(1.0)
    assert event is not None
    assert (event.gpu_uuid, event.kind) == (snapshot.gpus[1].uuid, "lost")
    assert not backend.probe(snapshot.gpus[1].uuid)


@pytest.mark.parametrize(
    "fault", [("nvmlDeviceRegisterEvents", 2), ("nvmlDeviceGetMemoryInfo", 2)], ids=str
)
async def test_the_monitor_keeps_such_a_gpu_unhealthy_past_its_hold_down(
    fault: tuple[str, int], tmp_path: Path
) -> None:
    """Unwatched or read in part: the GPU answers probes, yet stays marked."""
    fake = FakeNvml(load_spec("t4x4"), faults={fault: pynvml.NVML_ERROR_UNKNOWN})
    backend = open_backend(fake, tmp_path)
    snapshot = backend.snapshot()
    gpu = snapshot.gpus[2].uuid
    now = [0.0]

    async def inline(fn: Callable[[], T]) -> T:
        return fn()

    recovery = RecoveryPolicy(holddown_s=30.0)
    monitor = HealthMonitor(
        backend,
        XidPolicy(),
        lambda _: [],
        recovery=recovery,
        call=inline,
        clock=lambda: now[0],
    )
    monitor.set_hardware(snapshot, build_resources(snapshot, ResourceSettings()))
    event = backend.wait_event(1.0)
    assert event is not None
    monitor.handle_event(event)
    assert monitor.unhealthy == {gpu}
    now[0] = 31.0
    await monitor.probe_due()
    assert monitor.unhealthy == {gpu}, "still marked: its probe must not pass"

    del fake.faults[fault]
    backend.snapshot()  # a reload reads it in full and registers its events
    now[0] = 62.0
    await monitor.probe_due()
    assert monitor.unhealthy == frozenset()
