"""/metrics behind the Kubernetes API's token check, through real HTTP on both sides: a
scraper's request to the StatusServer, and the agent's TokenReview and SubjectAccessReview
to the API server stand-in enforcing exactly the agent's RBAC rules for it.

401 without a token or with one the API does not know, 403 for a user without `get` on
/metrics, 200 with the page for one with it; verdicts cached (one review per token until
the TTL, the cache bounded); a stalled or absent API answers 503 within the timeout; more
distinct tokens at once than the in-flight bound are answered 503 at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kube_fakes import FakeApiServer, fake_client, grants

from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.adapters.kube.rbac import METRICS_AUTH_RULES
from gpuslice.adapters.status_http import METRICS_NAME, StatusServer

NS = "gpu-operator"
PAGE = b"gpuslice_up 1\n"
SCRAPER = "system:serviceaccount:monitoring:prometheus-k8s"
REVIEWS = "tokenreviews"
ANSWER_WITHIN_S = 3.0


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    api: FakeApiServer
    port: int
    clock: Clock
    headers: dict[str, str] = field(default_factory=dict)  # of the last answer

    async def get(self, token: str | None = None, scheme: str = "Bearer") -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        auth = f"Authorization: {scheme} {token}\r\n" if token is not None else ""
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: node\r\n{auth}\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), ANSWER_WITHIN_S)
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        self.headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)
        }
        return int(status.split()[1]), body

    def token_reviews(self) -> int:
        return len(self.api.of("POST", REVIEWS))


async def rig_for(tmp_path: Path, **limits: Any) -> AsyncIterator[Rig]:
    async with FakeApiServer(grants(NS, METRICS_AUTH_RULES)) as api:
        api.reviews.add_token("prom-token", SCRAPER)
        api.reviews.add_token("other-token", "system:serviceaccount:ml:notebook")
        api.reviews.allow(SCRAPER, ["/metrics"])
        clock = Clock()
        node_api = KubeNodeApi(fake_client(api.url, tmp_path))
        auth = node_api.metrics_auth(clock=clock, **limits)
        page = lambda: ("text/plain; version=0.0.4", PAGE)  # noqa: E731
        server = StatusServer("127.0.0.1:0", None, page, name=METRICS_NAME, authorize=auth.verdict)
        async with server:
            yield Rig(api, server.port, clock)
        await node_api.aclose()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async for made in rig_for(tmp_path, timeout_s=0.5):
        yield made


async def test_no_token_is_401_without_asking_the_api(rig: Rig) -> None:
    for token, scheme in ((None, "Bearer"), ("prom-token", "Basic"), ("", "Bearer")):
        status, body = await rig.get(token, scheme)
        assert status == 401
        assert b"no bearer token" in body
        assert rig.headers["www-authenticate"] == 'Bearer realm="gpuslice"'  # RFC 9110 11.6.1
    assert rig.api.requests == []


async def test_a_token_the_api_does_not_know_is_401(rig: Rig) -> None:
    status, body = await rig.get("forged")
    assert status == 401
    assert b"authenticates no one" in body
    assert rig.headers["www-authenticate"].startswith("Bearer ")
    assert rig.token_reviews() == 1
    assert rig.api.of("POST", "subjectaccessreviews") == []


async def test_a_user_without_get_on_metrics_is_403_naming_the_user(rig: Rig) -> None:
    status, body = await rig.get("other-token")
    assert status == 403
    assert b"system:serviceaccount:ml:notebook" in body
    assert "www-authenticate" not in rig.headers  # authenticated: no challenge
    (review,) = rig.api.of("POST", "subjectaccessreviews")
    spec = review.body["spec"]
    assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    assert spec["user"] == "system:serviceaccount:ml:notebook"
    assert "system:authenticated" in spec["groups"]


async def test_an_allowed_scraper_gets_the_page_and_its_verdict_is_reused_until_the_ttl(
    rig: Rig,
) -> None:
    for _ in range(5):
        assert await rig.get("prom-token") == (200, PAGE)
    assert rig.token_reviews() == 1
    rig.clock.now += 59.0
    assert (await rig.get("prom-token"))[0] == 200
    assert rig.token_reviews() == 1
    rig.clock.now += 2.0  # past the 60 s TTL: asked again
    assert (await rig.get("prom-token"))[0] == 200
    assert rig.token_reviews() == 2


async def test_a_denied_verdict_is_cached_too(rig: Rig) -> None:
    for _ in range(3):
        assert (await rig.get("other-token"))[0] == 403
        assert (await rig.get("forged"))[0] == 401
    assert rig.token_reviews() == 2


async def test_concurrent_scrapes_with_one_token_share_one_review(rig: Rig) -> None:
    answers = await asyncio.gather(*(rig.get("prom-token") for _ in range(10)))
    assert answers == [(200, PAGE)] * 10
    assert rig.token_reviews() == 1


async def test_a_stalled_api_answers_503_within_the_timeout_and_is_not_cached(rig: Rig) -> None:
    rig.api.stall_next("POST", REVIEWS)
    status, body = await rig.get("prom-token")  # within ANSWER_WITHIN_S: the 0.5 s timeout
    assert status == 503
    assert b"cannot check the token now" in body
    assert await rig.get("prom-token") == (200, PAGE)  # asked again, and answered


async def test_an_api_that_is_gone_answers_503_and_its_return_serves_again(rig: Rig) -> None:
    await rig.api.close()
    assert (await rig.get("prom-token"))[0] == 503
    await rig.api.start(int(rig.api.url.rsplit(":", 1)[1]))
    assert await rig.get("prom-token") == (200, PAGE)


async def test_an_api_error_answers_503(rig: Rig) -> None:
    rig.api.fail_next("POST", REVIEWS, 500)
    assert (await rig.get("prom-token"))[0] == 503
    assert (await rig.get("prom-token"))[0] == 200


async def test_without_the_rbac_rules_the_scrape_is_503_not_a_pass(tmp_path: Path) -> None:
    async for rig in rig_for(tmp_path):
        rig.api.grants = []  # the agent may create no reviews
        status, _ = await rig.get("prom-token")
        assert status == 503
        assert rig.api.answered(403)


async def test_distinct_tokens_beyond_the_in_flight_bound_are_503_at_once(
    tmp_path: Path,
) -> None:
    async for rig in rig_for(tmp_path, max_in_flight=2, timeout_s=1.0):
        for _ in range(2):
            rig.api.stall_next("POST", REVIEWS)
        first = [asyncio.ensure_future(rig.get(f"random-{i}")) for i in range(2)]
        await rig.api.wait_for(lambda s: len(s.of("POST", REVIEWS)) == 2)
        assert (await rig.get("random-late"))[0] == 503  # before the two time out
        assert rig.token_reviews() == 2
        assert [s for s, _ in await asyncio.gather(*first)] == [503, 503]
        assert (await rig.get("prom-token"))[0] == 200  # slots free again


async def test_the_cache_is_bounded(tmp_path: Path) -> None:
    async for rig in rig_for(tmp_path, max_entries=2):
        for token in ("prom-token", "other-token", "forged"):
            await rig.get(token)
        assert rig.token_reviews() == 3
        await rig.get("prom-token")  # the oldest was dropped: asked again
        assert rig.token_reviews() == 4
