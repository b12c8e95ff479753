"""The restart rules: backoffs that double up to a cap, and the failure budget
counted as upstream counts it (a run of failures each within the window)."""

from __future__ import annotations

from gpuslice.core.restart import (
    REGISTER_RETRY,
    Backoff,
    FailureRun,
    RestartBudget,
    after_failure,
    jittered,
)


def test_a_backoff_doubles_from_its_first_delay_up_to_its_cap() -> None:
    assert [Backoff(0.1, 1.0).delay(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert Backoff(0.1, 1.0).delay(0) == 0.1  # no attempt before the first
    assert [REGISTER_RETRY.delay(n) for n in (1, 2, 5, 6)] == [0.5, 1.0, 8.0, 10.0]


def test_upstreams_budget_restarts_five_times_then_gives_up() -> None:
    budget, run, delays = RestartBudget(), FailureRun(), []
    for now in range(6):
        verdict = after_failure(run, float(now), budget)
        run = verdict.run
        delays.append(verdict.retry_in_s)
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, None]
    assert run == FailureRun(6, 5.0)
    assert verdict.gave_up


def test_a_failure_more_than_a_window_after_the_last_starts_a_new_run() -> None:
    budget = RestartBudget(max_restarts=2, window_s=60.0)
    run = after_failure(FailureRun(), 0.0, budget).run
    run = after_failure(run, 60.0, budget).run  # exactly the window: still the same run
    assert run.count == 2
    verdict = after_failure(run, 120.5, budget)  # 60.5 s later: a new run
    assert (verdict.run.count, verdict.retry_in_s) == (1, budget.first_delay_s)


def test_the_budget_describes_itself_for_the_one_line_error() -> None:
    assert RestartBudget().describe() == "at most 5 restarts, each within 3600s of the last"


def test_a_jittered_wait_is_spread_by_a_fifth_either_way() -> None:
    assert jittered(10.0, min) == 8.0
    assert jittered(10.0, max) == 12.0
