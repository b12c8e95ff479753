"""The verdict cache of /metrics tokens: a verdict is reused until its TTL, the least
recently used goes first beyond the size bound, and an UNAVAILABLE one is never kept."""

from __future__ import annotations

import pytest

from gpuslice.core.access_cache import AccessVerdict, Outcome, VerdictCache

ALLOWED = AccessVerdict(Outcome.ALLOWED)
DENIED = AccessVerdict(Outcome.FORBIDDEN, "no")


def test_a_verdict_lives_until_its_ttl() -> None:
    cache = VerdictCache(4, ttl_s=10.0)
    cache.put(b"a", ALLOWED, now=100.0)
    assert cache.get(b"a", 109.9) == ALLOWED
    assert cache.get(b"a", 110.0) is None
    assert len(cache) == 0  # the expired entry is gone, not only hidden


def test_the_least_recently_used_goes_first() -> None:
    cache = VerdictCache(2, ttl_s=10.0)
    cache.put(b"a", ALLOWED, 0.0)
    cache.put(b"b", DENIED, 0.0)
    assert cache.get(b"a", 1.0) == ALLOWED  # now b is the least recent
    cache.put(b"c", DENIED, 1.0)
    assert len(cache) == 2
    assert cache.get(b"b", 1.0) is None
    assert cache.get(b"a", 1.0) == ALLOWED


def test_an_unavailable_api_is_asked_again_next_time() -> None:
    cache = VerdictCache(2, ttl_s=10.0)
    cache.put(b"a", AccessVerdict(Outcome.UNAVAILABLE, "down"), 0.0)
    assert cache.get(b"a", 0.0) is None


@pytest.mark.parametrize(("size", "ttl"), [(0, 1.0), (1, 0.0)])
def test_a_cache_needs_room_and_time(size: int, ttl: float) -> None:
    with pytest.raises(ValueError, match="max_entries"):
        VerdictCache(size, ttl)
