"""The simulated node's events file as hostile input: a deeply nested line, a 200 MB
line without a newline, a file truncated and rewritten longer, a file rotated by
rename, a FIFO in its place. Each bad line is one warning; no event is lost; memory
stays bounded; no GPU is marked unhealthy by a line that is not an event."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.adapters.fake import FakeBackend
from gpuslice.adapters.fake.events import MAX_LINE, EventFile, parse_event
from gpuslice.adapters.fake.profiles import load_spec
from gpuslice.core.devices import HealthEvent

SNAPSHOT = load_spec("t4x4")


def xid(gpu: int, code: int = 31) -> str:
    return json.dumps({"gpu": gpu, "xid": code}) + "\n"


def lines(events: EventFile) -> list[bytes]:
    return [line for _, line in events.new_lines()]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


@pytest.fixture
def backend(path: Path) -> Iterator[FakeBackend]:
    one = FakeBackend(SNAPSHOT, path)
    yield one
    one.close()


def test_a_deeply_nested_line_is_one_warning_and_marks_nothing(
    path: Path, backend: FakeBackend
) -> None:
    """RecursionError escaped before, and every GPU was marked unhealthy."""
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n" + xid(2))
    event = backend.wait_event(5.0)
    assert event == HealthEvent(gpu_uuid=SNAPSHOT.gpus[2].uuid, kind="xid", xid=31)
    (warning,) = backend.warnings
    assert warning.endswith(":1: longer than 65536 bytes; line skipped")
    assert all(backend.probe(g.uuid) for g in SNAPSHOT.gpus)


def test_nesting_within_the_line_limit_is_refused_too(path: Path, backend: FakeBackend) -> None:
    path.write_text("[" * 5000 + "]" * 5000 + "\n" + xid(1))
    assert backend.wait_event(5.0) is not None
    (warning,) = backend.warnings
    assert "nested deeper than" in warning


def test_a_200_mb_line_without_a_newline_keeps_memory_bounded(path: Path) -> None:
    """RSS reached 456 MiB before: the partial line was kept whole."""
    with open(path, "wb") as fh:
        fh.truncate(200 << 20)  # sparse: 200 MB of NUL bytes, no newline
    events = EventFile(path)
    tracemalloc.start()
    try:
        got: list[bytes] = []
        for _ in range(210):  # at most MAX_READ bytes per call
            got += lines(events)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        events.close()
    assert peak < 8 << 20
    assert [len(line) for line in got] == [MAX_LINE + 1]  # one line, cut: parse_event refuses


def test_the_end_of_a_cut_line_is_skipped_and_the_next_line_read(path: Path) -> None:
    events = EventFile(path)
    path.write_bytes(b"x" * (MAX_LINE + 10))
    assert [len(line) for line in lines(events)] == [MAX_LINE + 1]
    with open(path, "ab") as fh:
        fh.write(b"tail\n" + xid(0).encode())
    assert lines(events) == [xid(0).encode().rstrip(b"\n")]
    assert events.line_number == 2
    events.close()


def test_a_file_truncated_and_rewritten_longer_is_read_again(path: Path) -> None:
    """Only a shorter file counted as truncated before: events written after a
    truncation that outgrew the old size were lost."""
    events = EventFile(path)
    path.write_text(xid(0))
    assert len(lines(events)) == 1
    path.write_text(xid(1) + xid(2) + xid(3))  # truncated, then longer than before
    assert lines(events) == [xid(i).encode().rstrip(b"\n") for i in (1, 2, 3)]
    events.close()


def test_a_file_rotated_by_rename_loses_no_event(path: Path) -> None:
    events = EventFile(path)
    path.write_text(xid(0))
    assert len(lines(events)) == 1
    with open(path, "a") as fh:
        fh.write(xid(1))  # written before the rotation, not read yet
    os.rename(path, path.with_suffix(".1"))
    path.write_text(xid(2))
    assert lines(events) == [xid(1).encode().rstrip(b"\n"), xid(2).encode().rstrip(b"\n")]
    events.close()


def test_a_fifo_is_refused_with_one_line(path: Path, logged: list[dict[str, Any]]) -> None:
    os.mkfifo(path)
    events = EventFile(path)
    assert lines(events) == []
    assert lines(events) == []  # said once, not per read
    assert [e["event"] for e in logged] == ["fake_events_file_refused"]
    assert "not a regular file" in logged[0]["problem"]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["gpu", "xid", "lost", "recovered", "mig", "process", "process_exit"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | _JSON.map(lambda doc: json.dumps(doc).encode()))
def test_any_line_is_an_event_or_one_value_error(line: bytes) -> None:
    """Property: parse_event answers an event, None, or a one-line ValueError."""
    try:
        parse_event(line, SNAPSHOT)
    except ValueError as exc:
        message = str(exc)
    else:
        return
    assert "\n" not in message
