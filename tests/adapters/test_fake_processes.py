"""The simulated backend's processes: the node file's, then started, grown, moved out
of a pod and ended by lines of the events file; their pods come from those lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuslice.adapters.fake import FakeBackend
from gpuslice.core.usage import ProcessOwner, ProcessUse

MIB = 1024 * 1024


def write(path: Path, *lines: object) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(line) + "\n" for line in lines)


def by_pid(backend: FakeBackend, gpu: int) -> dict[int, ProcessUse]:
    return {p.pid: p for d in backend.processes().gpus[gpu].devices for p in d.processes}


def test_a_process_starts_in_a_pod_grows_and_exits(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    backend = FakeBackend.from_spec("t4x4", str(events))
    node_file_pids = set(by_pid(backend, 1))  # t4x4 carries processes on GPU 1
    assert node_file_pids
    assert backend.owners(node_file_pids) == {}
    start = {"pid": 4242, "gpu": 0, "memory_mib": 1200, "sm_util": 30, "pod_uid": "u1"}
    write(events, {"process": start | {"container_id": "c1"}})
    assert by_pid(backend, 0) == {4242: ProcessUse(4242, 1200 * MIB, 0.3)}
    assert backend.owners([4242, 1]) == {4242: ProcessOwner("u1", "c1")}
    write(events, {"process": start | {"memory_mib": 3000}})
    assert by_pid(backend, 0)[4242].memory_bytes == 3000 * MIB
    assert backend.processes().gpus[0].memory_used_bytes == 3000 * MIB
    write(events, {"process_exit": 4242})
    assert by_pid(backend, 0) == {}
    assert backend.owners([4242]) == {}


def test_process_lines_pass_the_health_thread_by(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    backend = FakeBackend.from_spec("t4", str(events))
    write(events, {"process": {"pid": 9, "gpu": 0, "memory_mib": 1}}, {"gpu": 0, "xid": 48})
    event = backend.wait_event(2.0)
    assert event is not None
    assert event.xid == 48
    assert 9 in by_pid(backend, 0)
    assert backend.warnings == ()


def test_a_mig_process_runs_on_a_mig_device_without_utilisation(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    backend = FakeBackend.from_spec("a100-40gb-mig-mixed", str(events))
    write(events, {"process": {"pid": 5, "gpu": 0, "mig": 2, "memory_mib": 100, "sm_util": 50}})
    gpu = backend.snapshot().gpus[0]
    device = next(
        d for d in backend.processes().gpus[0].devices if d.uuid == gpu.mig_devices[2].uuid
    )
    assert device.processes == (ProcessUse(5, 100 * MIB, None),)
    assert device.util_absent == "mig"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({"process": {"pid": 1, "gpu": 9, "memory_mib": 1}}, "no GPU 9"),
        ({"process": {"pid": 0, "gpu": 0, "memory_mib": 1}}, '"pid" must be an integer >= 1'),
        ({"process": {"pid": 1, "gpu": 0}}, '"memory_mib" must be an integer'),
        ({"process": {"pid": 1, "gpu": 0, "memory_mib": 1, "sm_util": 101}}, "percentage"),
        ({"process": {"pid": 1, "gpu": 0, "memory_mib": 1, "pod": "x"}}, "unknown key 'pod'"),
        ({"process": {"pid": 1, "gpu": 0, "memory_mib": 1}, "gpu": 0}, "no other key"),
        ({"process_exit": "1"}, "positive pid"),
        ({"process": {"pid": 1, "gpu": 0, "memory_mib": 1, "mig": 0}}, "no MIG device 0"),
    ],
)
def test_a_malformed_process_line_is_skipped_with_a_reason(
    tmp_path: Path, line: object, reason: str
) -> None:
    events = tmp_path / "events.jsonl"
    backend = FakeBackend.from_spec("t4", str(events))
    write(events, line)
    assert by_pid(backend, 0) == {}
    (warning,) = backend.warnings
    assert reason in warning
    assert warning.endswith("line skipped")


def test_a_process_on_a_mig_gpu_must_name_its_mig_device(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    backend = FakeBackend.from_spec("a100-40gb-mig-single", str(events))
    write(events, {"process": {"pid": 1, "gpu": 0, "memory_mib": 1}})
    backend.processes()
    assert 'name its "mig" device' in backend.warnings[0]
