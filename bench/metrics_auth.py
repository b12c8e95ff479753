"""The cost of --metrics-auth kubernetes per scrape: one GET /metrics with a bearer token,
against the same page served with no check, side by side in each trial.

Three StatusServers serve one prebuilt page (about the size of a node with 64 containers'
accounting): with no check; with the check and a token whose verdict is cached (what a
Prometheus scraping every 15 s meets 3 times in 4); with the check and a new token on every
scrape (a TokenReview and a SubjectAccessReview each time, to the API server stand-in over
real HTTP on the loopback, in this same process: a real API server adds its TLS and its
authorizer to that). Each scrape is a new TCP connection, as the agent answers one request
per connection.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import tempfile
from pathlib import Path

from bench.harness import MS, Figure, Target, now
from bench.plan import Plan
from gpuslice.adapters.kube import KubeNodeApi
from gpuslice.adapters.kube.rbac import METRICS_AUTH_RULES
from gpuslice.adapters.status_http import METRICS_NAME, StatusServer
from gpuslice.testing.apiserver import FakeApiServer, Grant, write_kubeconfig

FIGURES = ("metrics_scrape_cached_auth", "metrics_scrape_uncached_auth")
SCRAPER = "system:serviceaccount:monitoring:prometheus"
PAGE_LINES = 1000  # about 77 KB, as 64 containers' accounting (docs/metrics.md)
PAGE = "".join(
    f'gpuslice_container_gpu_memory_used_bytes{{namespace="ml",pod="train-{i}",'
    f'container="main",gpu="{i % 8}"}} {i * 1048576}\n'
    for i in range(PAGE_LINES)
).encode()


def page() -> tuple[str, bytes]:
    return "text/plain; version=0.0.4; charset=utf-8", PAGE


async def scrape(port: int, token: str | None) -> float:
    """Milliseconds for one scrape, connect to close; raises unless it is a 200."""
    t0 = now()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: node\r\n{auth}\r\n".encode())
    raw = await reader.read()
    elapsed = (now() - t0) * 1e3
    writer.close()
    if not raw.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"scrape answered {raw[:40]!r}")
    return elapsed


async def run(plan: Plan) -> list[Figure]:
    scrapes = max(plan.calls // 10, 10)
    grants = [
        Grant(group, frozenset(rule.resources), frozenset(rule.verbs))
        for rule in METRICS_AUTH_RULES
        for group in rule.api_groups
    ]
    fresh = (f"token-{i}" for i in itertools.count())
    plain: list[float] = []
    cached: list[float] = []
    uncached: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-metrics-auth-") as work:
        async with FakeApiServer(grants) as api:
            api.reviews.allow(SCRAPER, ["/metrics"])
            api.reviews.add_token("prom", SCRAPER)
            node_api = KubeNodeApi(kubeconfig=write_kubeconfig(Path(work), api.url))
            check = node_api.metrics_auth(max_entries=16)
            servers = [
                StatusServer("127.0.0.1:0", None, page, name=METRICS_NAME),
                StatusServer("127.0.0.1:0", None, page, name=METRICS_NAME, authorize=check.verdict),
            ]
            try:
                async with servers[0] as open_server, servers[1] as auth_server:
                    for _ in range(plan.warmup // 10):
                        await scrape(open_server.port, None)
                        await scrape(auth_server.port, "prom")
                    for _ in range(plan.trials):
                        trial: tuple[list[float], list[float], list[float]] = ([], [], [])
                        for _ in range(scrapes):
                            trial[0].append(await scrape(open_server.port, None))
                            trial[1].append(await scrape(auth_server.port, "prom"))
                            token = next(fresh)
                            api.reviews.add_token(token, SCRAPER)
                            trial[2].append(await scrape(auth_server.port, token))
                        api.requests.clear()  # the stand-in keeps every request
                        for into, got in zip((plain, cached, uncached), trial, strict=True):
                            into.append(statistics.median(got))
            finally:
                await node_api.aclose()
    setup = {
        "setup": f"{len(PAGE)} byte page; {scrapes} scrapes of each kind per trial, "
        "interleaved; one TCP connection per scrape; API server stand-in on the loopback"
    }
    baseline = "the same page with no token check"
    return [
        Figure("metrics_scrape_cached_auth",
               "one /metrics scrape with a bearer token whose verdict is cached", MS, cached,
               (Target(1.5, "ratio"),), plain, baseline, setup),
        Figure("metrics_scrape_uncached_auth",
               "one /metrics scrape with a new token: TokenReview + SubjectAccessReview", MS,
               uncached, (Target(50.0),), plain, baseline, setup),
    ]  # fmt: skip
