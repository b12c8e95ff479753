"""Readiness from typed checks: every check must be ok; only details are shown, in order."""

from __future__ import annotations

from gpuslice.core.readiness import Check, reported, verdict


def test_ready_only_when_every_check_is_ok_and_details_keep_their_order() -> None:
    checks = [
        Check("started", True),
        Check("device-plugin", True, {"registered": 1}),
        reported("api", {"ok": False, "detail": "down; retrying"}),
    ]
    assert verdict(checks) == (
        True,
        {"device-plugin": {"registered": 1}, "api": {"ok": False, "detail": "down; retrying"}},
    )
    waiting = Check("mps", False, {"daemons": {}, "waiting": ["gpu"]})
    assert verdict([*checks, waiting])[0] is False
    assert verdict([Check("started", False), *checks[1:]]) == (False, verdict(checks)[1])
    assert verdict([]) == (True, {})
