"""Who may read /metrics, asked of the Kubernetes API as controller-runtime and
kube-rbac-proxy ask it: the request's bearer token goes to a TokenReview, and the user it
names to a SubjectAccessReview of `get` on the non-resource URL /metrics.

Bounded under load: verdicts are cached by the token's SHA-256 (core.access_cache: size
and age bounded), requests with one token share one review, at most `max_in_flight`
reviews run at once (beyond that the answer is 503 at once), and each review has
`timeout_s`: an API outage answers 503, never a hang. An unavailable API is logged once
when it starts and once when it ends.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from gpuslice.core.access_cache import AccessVerdict, Outcome, VerdictCache
from gpuslice.core.errors import BackendError

if TYPE_CHECKING:
    from gpuslice.adapters.kube.session import ApiSession

log = structlog.get_logger("gpuslice.metrics_auth")

PATH, VERB = "/metrics", "get"
TTL_S = 60.0  # as long as a verdict (allowed, denied, unknown token) is reused
MAX_ENTRIES = 1024
MAX_IN_FLIGHT = 8
TIMEOUT_S = 2.0  # both reviews of one token together
NO_TOKEN = AccessVerdict(Outcome.UNAUTHENTICATED, "no bearer token (Authorization: Bearer <token>)")
BUSY = AccessVerdict(Outcome.UNAVAILABLE, f"over {MAX_IN_FLIGHT} token reviews in flight; retry")


class MetricsAuth:
    """verdict(Authorization header) -> AccessVerdict, over one API session."""

    def __init__(
        self,
        session: ApiSession,
        *,
        ttl_s: float = TTL_S,
        max_entries: int = MAX_ENTRIES,
        max_in_flight: int = MAX_IN_FLIGHT,
        timeout_s: float = TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._cache = VerdictCache(max_entries, ttl_s)
        self._max_in_flight = max_in_flight
        self._timeout_s = timeout_s
        self._clock = clock
        self._pending: dict[bytes, asyncio.Future[AccessVerdict]] = {}
        self._api_down = False
        self.reviews = 0  # token reviews sent

    async def verdict(self, authorization: str | None) -> AccessVerdict:
        token = bearer_token(authorization)
        if token is None:
            return NO_TOKEN
        key = hashlib.sha256(token.encode()).digest()
        cached = self._cache.get(key, self._clock())
        if cached is not None:
            return cached
        pending = self._pending.get(key)
        if pending is None:
            if len(self._pending) >= self._max_in_flight:
                return BUSY
            pending = asyncio.ensure_future(self._review(token))
            self._pending[key] = pending
            pending.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(pending)

    def _finished(self, key: bytes, done: asyncio.Future[AccessVerdict]) -> None:
        self._pending.pop(key, None)
        if not done.cancelled() and done.exception() is None:
            self._cache.put(key, done.result(), self._clock())

    async def _review(self, token: str) -> AccessVerdict:
        self.reviews += 1
        try:
            async with asyncio.timeout(self._timeout_s):
                who = await self._session.review_token(token, self._timeout_s)
                if who is None:
                    self._api_up()
                    return AccessVerdict(Outcome.UNAUTHENTICATED, "the token authenticates no one")
                allowed, _ = await self._session.review_access(who, PATH, VERB, self._timeout_s)
        except TimeoutError:
            return self._unavailable(f"no answer within {self._timeout_s:g} s")
        except BackendError as exc:
            return self._unavailable(str(exc))
        self._api_up()
        if allowed:
            return AccessVerdict(Outcome.ALLOWED)
        return AccessVerdict(Outcome.FORBIDDEN, f'user "{who.user}" may not {VERB} {PATH}')

    def _unavailable(self, why: str) -> AccessVerdict:
        if not self._api_down:
            self._api_down = True
            log.warning("metrics_auth_unavailable", error=why)
        return AccessVerdict(
            Outcome.UNAVAILABLE, "cannot check the token now: the Kubernetes API failed"
        )

    def _api_up(self) -> None:
        if self._api_down:
            self._api_down = False
            log.info("metrics_auth_available")


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Authorization: Bearer <token>`; None for any other header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or not token.isascii() or not token.isprintable():
        return None
    return token
