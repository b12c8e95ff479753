"""Who may read /metrics: the verdicts of a token check and the cache that keeps them.

A verdict is what the Kubernetes API said about one bearer token: allowed, not
authenticated, or authenticated but denied. The cache keeps verdicts by a digest of the
token (never the token itself) for `ttl_s`, at most `max_entries` of them, dropping the
least recently used first. The caller passes the time, so this stays free of clocks.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass


class Outcome(enum.Enum):
    ALLOWED = "allowed"
    UNAUTHENTICATED = "unauthenticated"  # 401: no token, or the API does not know it
    FORBIDDEN = "forbidden"  # 403: a known user without `get` on the path
    UNAVAILABLE = "unavailable"  # 503: the API could not be asked (never cached)


@dataclass(frozen=True)
class AccessVerdict:
    outcome: Outcome
    why: str = ""  # one line, for the reply and the log; names no token


@dataclass(frozen=True)
class _Entry:
    verdict: AccessVerdict
    expires: float


class VerdictCache:
    """Verdicts by token digest: bounded in size and age."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        if max_entries < 1 or ttl_s <= 0:
            raise ValueError("a verdict cache needs max_entries >= 1 and ttl_s > 0")
        self._max = max_entries
        self._ttl_s = ttl_s
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes, now: float) -> AccessVerdict | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now >= entry.expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.verdict

    def put(self, key: bytes, verdict: AccessVerdict, now: float) -> None:
        """Keep `verdict` until now + ttl_s; an UNAVAILABLE one is not kept."""
        if verdict.outcome is Outcome.UNAVAILABLE:
            return
        self._entries[key] = _Entry(verdict, now + self._ttl_s)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
