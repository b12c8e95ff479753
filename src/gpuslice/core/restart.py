"""Restart rules for a served resource: the failure budget and the backoffs.

Pure values and functions: the caller brings the clock. A server that fails
(cannot start, or stops without being stopped) is started again after a backoff
that doubles from `first_delay_s` up to `max_delay_s`. Failures each within
`window_s` of the previous one form a run; a run longer than `max_restarts`
spends the budget. A failure more than `window_s` after the previous one starts
a new run, as upstream counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Retries many nodes make at once (after an API outage, a config change seen everywhere)
# are spread by up to this much either way, so they do not stay in step.
JITTER = 0.2


def jittered(seconds: float, draw: Callable[[float, float], float]) -> float:
    """`seconds` give or take up to JITTER of it; `draw` is random.uniform's shape."""
    return seconds * draw(1.0 - JITTER, 1.0 + JITTER)


def spread(seconds: float, draw: Callable[[float, float], float]) -> float:
    """Anywhere from 0 to `seconds` (full jitter): the retries of many clients that failed
    together (an API server's return) arrive spread over the whole delay."""
    return draw(0.0, seconds)


@dataclass(frozen=True)
class Backoff:
    """A delay that doubles with each attempt, from `first_s` up to `max_s`."""

    first_s: float
    max_s: float

    def delay(self, attempt: int) -> float:
        """The delay before retry number `attempt` (1 for the first)."""
        return min(self.first_s * 2.0 ** (max(attempt, 1) - 1), self.max_s)


# Register calls the kubelet did not take: retried at this pace (and at once when
# kubelet.sock appears). Also how often a socket another plugin serves is looked at.
REGISTER_RETRY = Backoff(first_s=0.5, max_s=10.0)

# A first read the Kubernetes API did not answer (slow, away, erring) at start: tried again
# at this pace, jittered, for as long as it takes. A read that timed out already took the
# client's timeout, so the cap adds little load on a struggling server.
API_FIRST_READ = Backoff(first_s=0.5, max_s=10.0)


@dataclass(frozen=True)
class RestartBudget:
    """How often one resource's server may fail before the agent gives up."""

    max_restarts: int = 5
    window_s: float = 3600.0  # a failure this long after the previous one starts a new run
    first_delay_s: float = 0.1  # backoff before the first restart, doubled after each
    max_delay_s: float = 5.0

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.first_delay_s, self.max_delay_s)

    def describe(self) -> str:
        return f"at most {self.max_restarts} restarts, each within {self.window_s:g}s of the last"


@dataclass(frozen=True)
class FailureRun:
    """The failures of one server in a row, and when the last one was."""

    count: int = 0
    last: float | None = None


@dataclass(frozen=True)
class RestartDecision:
    """What follows a failure: a restart after `retry_in_s`, or giving up (None)."""

    run: FailureRun
    retry_in_s: float | None

    @property
    def gave_up(self) -> bool:
        return self.retry_in_s is None


def after_failure(run: FailureRun, now: float, budget: RestartBudget) -> RestartDecision:
    """Count a failure at `now` into `run` and say what follows it."""
    within = run.last is not None and now - run.last <= budget.window_s
    counted = FailureRun(run.count + 1 if within else 1, now)
    if counted.count > budget.max_restarts:
        return RestartDecision(counted, None)
    return RestartDecision(counted, budget.backoff.delay(counted.count))
