"""XidPolicy and apply_event: which events change a GPU's health."""

from __future__ import annotations

import pytest

from gpuslice.core.devices import HealthEvent
from gpuslice.core.health import DEFAULT_IGNORED_XIDS, XidPolicy, apply_event

from . import builders as b

GPU0, GPU1 = b.gpu_uuid(0), b.gpu_uuid(1)
DEFAULT = XidPolicy()


def xid(code: int, uuid: str = GPU0) -> HealthEvent:
    return HealthEvent(gpu_uuid=uuid, kind="xid", xid=code)


def test_default_ignored_xids_match_upstream() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == DEFAULT_IGNORED_XIDS


@pytest.mark.parametrize("code", sorted(DEFAULT_IGNORED_XIDS))
def test_ignored_xids_leave_health_unchanged(code: int) -> None:
    assert DEFAULT.verdict(xid(code)) is None
    assert apply_event(frozenset(), xid(code), DEFAULT) == frozenset()
    assert apply_event(frozenset({GPU0}), xid(code), DEFAULT) == {GPU0}


@pytest.mark.parametrize("code", [48, 79, 94, 95])
def test_other_xids_mark_the_gpu_unhealthy(code: int) -> None:
    assert DEFAULT.verdict(xid(code)) is False
    assert apply_event(frozenset({GPU1}), xid(code), DEFAULT) == {GPU0, GPU1}


def test_lost_marks_unhealthy_and_recovered_clears() -> None:
    lost = HealthEvent(gpu_uuid=GPU0, kind="lost", detail="fell off the bus")
    back = HealthEvent(gpu_uuid=GPU0, kind="recovered")
    down = apply_event(frozenset({GPU1}), lost, DEFAULT)
    assert down == {GPU0, GPU1}
    assert apply_event(down, back, DEFAULT) == {GPU1}
    assert apply_event(frozenset(), back, DEFAULT) == frozenset()


def test_custom_ignored_set_replaces_the_default() -> None:
    policy = XidPolicy(ignored=frozenset({48}))
    assert apply_event(frozenset(), xid(48), policy) == frozenset()
    assert apply_event(frozenset(), xid(13), policy) == {GPU0}


def test_unknown_event_kind_changes_nothing() -> None:
    event = HealthEvent(gpu_uuid=GPU0, kind="ecc", xid=48)
    assert apply_event(frozenset(), event, DEFAULT) == frozenset()


@pytest.mark.parametrize(
    "event",
    [
        xid(79),
        HealthEvent(gpu_uuid=GPU0, kind="lost"),
        HealthEvent(gpu_uuid=GPU0, kind="recovered"),
    ],
    ids=["xid", "lost", "recovered"],
)
def test_disabled_policy_ignores_everything(event: HealthEvent) -> None:
    off = XidPolicy(enabled=False)
    assert off.verdict(event) is None
    assert apply_event(frozenset({GPU0}), event, off) == {GPU0}
    assert apply_event(frozenset(), event, off) == frozenset()
