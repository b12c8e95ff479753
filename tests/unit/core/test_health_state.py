"""HealthBook: marks, fault classes, hold-down re-probes, recovered events, the flap cap."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice.core.health_state import (
    FATAL,
    FATAL_XIDS,
    LOST,
    TRANSIENT,
    WAIT_FAILED,
    XID,
    HealthBook,
    RecoveryPolicy,
)

A, B = "GPU-a", "GPU-b"


def book(**kw: Any) -> HealthBook:
    return HealthBook(RecoveryPolicy(**kw))


def recover_by_probe(hb: HealthBook, device: str, now: float) -> list[str]:
    """Probe every due mark at `now`, all answering; returns the recovered devices."""
    done = []
    for dev, seen in hb.due(now):
        done += [c.device for c in hb.probed(dev, seen, True, now=now) if c.action == "recovered"]
    return done


def test_fatal_xids_follow_the_catalogue_table() -> None:
    assert {48, 64, 79, 92, 95} <= FATAL_XIDS
    assert not {13, 31, 43, 45, 63, 68, 94, 109} & FATAL_XIDS
    policy = RecoveryPolicy()
    assert policy.severity(XID, 79) == FATAL
    assert policy.severity(XID, 94) == TRANSIENT
    assert policy.severity(LOST, 0) == TRANSIENT
    assert policy.severity(WAIT_FAILED, 0) == TRANSIENT


def test_a_mark_records_why_and_when() -> None:
    hb = book(holddown_s=30.0)
    [change] = hb.mark([A], cause=XID, xid=94, detail="gi=1 ci=0", now=100.0)
    assert change.action == "marked"
    reason = hb.reasons[A]
    assert (reason.cause, reason.xid, reason.severity) == (XID, 94, TRANSIENT)
    assert (reason.since, reason.last, reason.probe_at) == (100.0, 100.0, 130.0)
    assert reason.detail == "gi=1 ci=0"
    assert not reason.held
    assert hb.unhealthy == {A}


def test_transient_mark_is_probed_after_the_holddown_and_clears_when_it_answers() -> None:
    hb = book(holddown_s=30.0)
    hb.mark([A, B], cause=XID, xid=94, now=0.0)
    assert hb.next_probe_at() == 30.0
    assert hb.due(29.9) == []
    assert recover_by_probe(hb, A, 30.0) == [A, B]
    assert hb.unhealthy == frozenset()


def test_a_failed_probe_keeps_the_mark_and_rearms_the_holddown() -> None:
    hb = book(holddown_s=30.0)
    hb.mark([A], cause=LOST, now=0.0)
    [(dev, seen)] = hb.due(30.0)
    assert hb.probed(dev, seen, False, now=31.0) == []
    assert hb.unhealthy == {A}
    assert hb.reasons[A].probe_at == 61.0
    assert hb.reasons[A].since == 0.0


def test_fatal_marks_are_never_probed_nor_cleared_by_events() -> None:
    hb = book(holddown_s=1.0)
    hb.mark([A], cause=XID, xid=79, now=0.0)
    assert hb.reasons[A].held
    assert hb.reasons[A].probe_at is None
    assert hb.due(1e9) == []
    assert hb.next_probe_at() is None
    [kept] = hb.clear([A], now=5.0)
    assert (kept.action, kept.via) == ("kept", "fatal")
    assert hb.unhealthy == {A}


def test_a_repeat_rearms_the_holddown_and_keeps_the_episode_start() -> None:
    hb = book(holddown_s=30.0)
    hb.mark([A], cause=XID, xid=94, now=0.0)
    assert hb.mark([A], cause=LOST, now=20.0) == []
    reason = hb.reasons[A]
    assert (reason.cause, reason.since, reason.last, reason.probe_at) == (LOST, 0.0, 20.0, 50.0)
    assert hb.due(30.0) == []


def test_a_probe_result_is_ignored_when_a_new_event_came_meanwhile() -> None:
    hb = book(holddown_s=30.0)
    hb.mark([A], cause=XID, xid=94, now=0.0)
    [(dev, seen)] = hb.due(30.0)
    hb.mark([A], cause=XID, xid=94, now=30.5)  # while the probe ran
    assert hb.probed(dev, seen, True, now=31.0) == []
    assert hb.unhealthy == {A}


def test_fatal_escalates_a_transient_mark_and_transient_never_weakens_fatal() -> None:
    hb = book()
    hb.mark([A], cause=LOST, now=0.0)
    [change] = hb.mark([A], cause=XID, xid=48, now=5.0)
    assert change.action == "escalated"
    assert (hb.reasons[A].severity, hb.reasons[A].since) == (FATAL, 0.0)
    assert hb.mark([A], cause=XID, xid=94, now=6.0) == []
    assert (hb.reasons[A].severity, hb.reasons[A].xid, hb.reasons[A].last) == (FATAL, 48, 6.0)


def test_a_recovered_event_clears_transient_marks_at_once() -> None:
    hb = book(holddown_s=30.0)
    hb.mark([A], cause=LOST, now=0.0)
    hb.mark([B], cause=XID, xid=94, now=0.0)
    changes = hb.clear([A, B, "GPU-never-marked"], now=1.0)
    assert [(c.device, c.action, c.via) for c in changes] == [
        (A, "recovered", "event"),
        (B, "recovered", "event"),
    ]
    assert hb.unhealthy == frozenset()


def test_flap_cap_holds_a_device_after_max_recoveries_within_the_window() -> None:
    hb = book(holddown_s=10.0, max_flaps=3, flap_window_s=600.0)
    for n in range(3):
        t = n * 20.0
        hb.mark([A], cause=XID, xid=94, now=t)
        assert recover_by_probe(hb, A, t + 10.0) == [A]
    [change] = hb.mark([A], cause=XID, xid=94, now=70.0)
    reason = change.reason
    assert reason.flapping
    assert reason.held
    assert reason.probe_at is None
    assert hb.due(1e9) == []
    assert hb.clear([A], now=80.0)[0].via == "flapping"
    assert hb.unhealthy == {A}


def test_recoveries_outside_the_window_do_not_count() -> None:
    hb = book(holddown_s=10.0, max_flaps=2, flap_window_s=100.0)
    for t in (0.0, 20.0):
        hb.mark([A], cause=XID, xid=94, now=t)
        recover_by_probe(hb, A, t + 10.0)
    hb.mark([A], cause=XID, xid=94, now=115.0)  # the recovery at 10 has left the window
    assert not hb.reasons[A].flapping
    assert recover_by_probe(hb, A, 125.0) == [A]
    hb.mark([A], cause=XID, xid=94, now=126.0)  # recoveries at 30 and 125: held
    assert hb.reasons[A].flapping


def test_flaps_are_counted_per_device() -> None:
    hb = book(holddown_s=1.0, max_flaps=1)
    hb.mark([A], cause=XID, xid=94, now=0.0)
    recover_by_probe(hb, A, 1.0)
    hb.mark([A, B], cause=XID, xid=94, now=2.0)
    assert hb.reasons[A].flapping
    assert not hb.reasons[B].flapping


def test_recovered_events_count_as_flaps() -> None:
    hb = book(max_flaps=1)
    hb.mark([A], cause=LOST, now=0.0)
    hb.clear([A], now=1.0)
    hb.mark([A], cause=LOST, now=2.0)
    assert hb.reasons[A].flapping


def test_zero_max_flaps_means_marks_never_recover() -> None:
    hb = book(max_flaps=0)
    hb.mark([A], cause=XID, xid=94, now=0.0)
    assert hb.reasons[A].held


def test_infinite_window_counts_every_recovery() -> None:
    hb = book(holddown_s=1.0, max_flaps=1, flap_window_s=None)
    hb.mark([A], cause=XID, xid=94, now=0.0)
    recover_by_probe(hb, A, 1.0)
    hb.mark([A], cause=XID, xid=94, now=1e9)
    assert hb.reasons[A].flapping


def test_without_a_holddown_transient_marks_wait_for_a_recovered_event() -> None:
    hb = book(holddown_s=None)
    hb.mark([A], cause=XID, xid=94, now=0.0)
    reason = hb.reasons[A]
    assert reason.probe_at is None
    assert not reason.held
    assert hb.due(1e9) == []
    assert hb.clear([A], now=5.0)[0].action == "recovered"


def test_forget_drops_marks_of_devices_no_longer_present() -> None:
    hb = book()
    hb.mark([A, B], cause=XID, xid=79, now=0.0)
    assert hb.forget([A, "GPU-c"]) == [B]
    assert hb.unhealthy == {A}


@pytest.mark.parametrize("xid", sorted(FATAL_XIDS))
def test_every_fatal_xid_is_held(xid: int) -> None:
    hb = book()
    hb.mark([A], cause=XID, xid=xid, now=0.0)
    assert hb.reasons[A].held
