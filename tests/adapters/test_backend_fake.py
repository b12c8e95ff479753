"""FakeBackend health: events appended by other processes, probe state, close."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuslice.adapters.fake import FakeBackend
from gpuslice.core.devices import HealthEvent

APPEND = "import sys; f = open(sys.argv[1], 'a'); f.write(sys.argv[2]); f.close()"


def append(path: Path, text: str) -> None:
    """Append from another process, as a person or a test harness would."""
    subprocess.run([sys.executable, "-c", APPEND, str(path), text], check=True)


def next_events(backend: FakeBackend, count: int) -> list[HealthEvent]:
    events: list[HealthEvent] = []
    for _ in range(count):
        event = backend.wait_event(5.0)
        assert event is not None, f"only {len(events)} of {count} events arrived"
        events.append(event)
    return events


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def mixed(events_file: Path) -> Iterator[FakeBackend]:
    backend = FakeBackend.from_spec("a100-40gb-mig-mixed", str(events_file))
    yield backend
    backend.close()


def test_every_event_form_arrives_in_order(mixed: FakeBackend, events_file: Path) -> None:
    gpu0, gpu1 = mixed.snapshot().gpus
    append(
        events_file,
        '{"gpu": 0, "xid": 79}\n'
        f'{{"gpu": "{gpu1.uuid}", "xid": 48}}\n'
        '{"gpu": 1, "lost": true}\n'
        '{"gpu": 1, "recovered": true}\n'
        '{"gpu": 0, "mig": 1, "xid": 31}\n',
    )
    assert next_events(mixed, 5) == [
        HealthEvent(gpu0.uuid, "xid", xid=79),
        HealthEvent(gpu1.uuid, "xid", xid=48),
        HealthEvent(gpu1.uuid, "lost"),
        HealthEvent(gpu1.uuid, "recovered"),
        HealthEvent(gpu0.uuid, "xid", xid=31, detail="gi=3 ci=0"),
    ]
    assert mixed.wait_event(0.05) is None


def test_events_file_created_after_start(mixed: FakeBackend, events_file: Path) -> None:
    assert mixed.wait_event(0.05) is None
    append(events_file, '{"gpu": 1, "xid": 94}\n')
    assert next_events(mixed, 1)[0].xid == 94


def test_a_partial_line_waits_for_its_newline(mixed: FakeBackend, events_file: Path) -> None:
    append(events_file, '{"gpu": 0, "xi')
    assert mixed.wait_event(0.1) is None
    append(events_file, 'd": 43}\n{"gpu": 1, "xid": 45}')
    assert next_events(mixed, 1)[0].xid == 43
    assert mixed.wait_event(0.1) is None
    append(events_file, "\n")
    assert next_events(mixed, 1)[0].xid == 45


def test_malformed_lines_are_skipped_with_a_warning_each(
    mixed: FakeBackend, events_file: Path
) -> None:
    bad = [
        "not json",
        "[1, 2]",
        '{"gpu": 9, "xid": 79}',
        '{"gpu": 0}',
        '{"gpu": 0, "xid": 0}',
        '{"gpu": 0, "xid": true}',
        '{"gpu": 0, "lost": false}',
        '{"gpu": 0, "xid": 13, "lost": true}',
        '{"gpu": 0, "xid": 13, "color": "red"}',
        '{"gpu": 0, "mig": 7, "xid": 13}',
        '{"gpu": 1.5, "xid": 13}',
    ]
    append(events_file, "\n".join([*bad, "", '{"gpu": 0, "xid": 62}']) + "\n")
    assert next_events(mixed, 1) == [HealthEvent(mixed.snapshot().gpus[0].uuid, "xid", xid=62)]
    warnings = mixed.warnings
    assert len(warnings) == len(bad)
    for number, warning in enumerate(warnings, start=1):
        assert warning.startswith(f"{events_file}:{number}: ")
        assert "\n" not in warning
    assert "no GPU 9" in warnings[2]
    assert "unknown key 'color'" in warnings[8]


def test_lost_and_xid_79_fail_probe_until_recovered(mixed: FakeBackend, events_file: Path) -> None:
    gpu0, gpu1 = mixed.snapshot().gpus
    append(events_file, '{"gpu": 0, "lost": true}\n{"gpu": 1, "xid": 79}\n')
    assert not mixed.probe(gpu0.uuid)
    assert not mixed.probe(gpu1.uuid)
    assert not mixed.probe(gpu0.mig_devices[0].uuid), "a MIG device follows its parent"
    append(events_file, '{"gpu": 0, "recovered": true}\n{"gpu": 1, "xid": 48}\n')
    assert mixed.probe(gpu0.uuid)
    assert mixed.probe(gpu0.mig_devices[0].uuid)
    assert not mixed.probe(gpu1.uuid), "another XID does not bring a lost GPU back"
    assert len(mixed.snapshot().gpus) == 2, "a lost GPU stays in the snapshot"
    assert [e.kind for e in next_events(mixed, 4)] == ["lost", "xid", "recovered", "xid"]


def test_probe_of_an_unknown_uuid_is_false(mixed: FakeBackend) -> None:
    assert not mixed.probe("GPU-00000000-0000-0000-0000-000000000000")


def test_a_replaced_events_file_is_read_from_its_start(
    mixed: FakeBackend, events_file: Path
) -> None:
    append(events_file, '{"gpu": 0, "xid": 13}\n' * 3)
    assert len(next_events(mixed, 3)) == 3
    replacement = events_file.with_suffix(".new")
    replacement.write_text('{"gpu": 1, "xid": 64}\n')
    replacement.replace(events_file)
    assert next_events(mixed, 1)[0].xid == 64


def test_close_wakes_a_blocked_wait(mixed: FakeBackend) -> None:
    result: list[HealthEvent | None] = []
    waiter = threading.Thread(target=lambda: result.append(mixed.wait_event(30.0)))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive(), "the wait should still be blocked"
    mixed.close()
    waiter.join(timeout=5.0)
    assert result == [None]


def test_without_an_events_file_wait_just_times_out() -> None:
    backend = FakeBackend.from_spec("t4")
    started = time.monotonic()
    assert backend.wait_event(0.1) is None
    assert time.monotonic() - started >= 0.09
    assert backend.probe(backend.snapshot().gpus[0].uuid)


def test_kill_ends_the_simulated_process_without_signalling_the_host(events_file: Path) -> None:
    # The simulated PID is this very test process's: were it signalled, the test would die.
    backend = FakeBackend.from_spec("t4", str(events_file))
    me = os.getpid()
    line = {"process": {"pid": me, "gpu": 0, "memory_mib": 100, "pod_uid": "uid-1"}}
    append(events_file, json.dumps(line) + "\n")
    try:
        assert me in backend.processes().pids()
        backend.kill(me)
        assert me not in backend.processes().pids()
        assert backend.owners([me]) == {}
        with pytest.raises(ProcessLookupError):
            backend.kill(me)  # already ended, as os.kill says of a gone PID
    finally:
        backend.close()
