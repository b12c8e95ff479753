"""`gpuslice run --metrics-auth kubernetes`, wired as the chart runs it, against the API
server stand-in granting exactly the agent's RBAC rules (RULES and METRICS_AUTH_RULES):
/metrics is 401 without a token and 403 for an account without `get` on /metrics, the
probes need no token, and a real Prometheus sending its account's token scrapes it
(`authorization: credentials_file`, as docs/metrics.md shows). Without the Kubernetes API
the agent refuses the flag in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

from metrics_harness import Prometheus, free_port, prometheus_binary, scraped_node
from node_harness import NAMESPACE
from process_harness import AgentProcess, run_once

from gpuslice.adapters.kube.rbac import METRICS_AUTH_RULES
from gpuslice.testing.apiserver import Grant

SCRAPER = "system:serviceaccount:monitoring:prometheus"
AUTH = ("--metrics-auth", "kubernetes")


async def status_of(port: int, path: str, token: str | None = None) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: agent\r\n{auth}\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(raw.split()[1])


def review_grants() -> list[Grant]:
    return [
        Grant(group, frozenset(rule.resources), frozenset(rule.verbs), rule.namespace(NAMESPACE))
        for rule in METRICS_AUTH_RULES
        for group in rule.api_groups
    ]


async def test_metrics_ask_for_a_token_that_rbac_allows_and_probes_do_not(
    plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    async with scraped_node(plugin_dir, tmp_path, extra=AUTH) as node:
        processes.append(node.proc)
        assert node.api.grants is not None
        node.api.grants += review_grants()
        node.api.reviews.add_token("prom", SCRAPER)
        node.api.reviews.add_token("nosy", "system:serviceaccount:ml:notebook")
        node.api.reviews.allow(SCRAPER, ["/metrics"])
        assert await status_of(node.port, "/metrics") == 401
        assert await status_of(node.port, "/metrics", "nosy") == 403
        assert await status_of(node.port, "/metrics", "prom") == 200
        assert await status_of(node.port, "/healthz") == 200
        assert await status_of(node.port, "/readyz") in (200, 503)
        assert len(node.api.of("POST", "tokenreviews")) == 2  # prom's verdict is cached


async def test_a_real_prometheus_scrapes_with_its_token(
    plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    binary = prometheus_binary()  # fails rather than skips where CI requires it
    port = free_port()
    work = tmp_path / "prometheus"
    work.mkdir()
    token = work / "token"
    token.write_text("prom\n")  # as a mounted service account token ends
    prometheus = Prometheus(binary, f"127.0.0.1:{port}", work, token_file=token)
    await prometheus.start()
    try:
        async with scraped_node(plugin_dir, tmp_path, port, extra=AUTH) as node:
            processes.append(node.proc)
            assert node.api.grants is not None
            node.api.grants += review_grants()
            node.api.reviews.add_token("prom", SCRAPER)
            node.api.reviews.allow(SCRAPER, ["/metrics"])
            await prometheus.until('up{job="gpuslice"}', lambda r: list(r.values()) == [1.0])
            assert prometheus.query("gpuslice_devices_advertised")
    finally:
        await prometheus.stop()


def test_without_the_kubernetes_api_the_flag_is_refused_in_one_line(tmp_path: Path) -> None:
    result = run_once("run", "--fake-hardware", "t4", "--kubelet-socket", "",
                      "--status-address", "127.0.0.1:0", *AUTH)  # fmt: skip
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()  # no traceback
    assert line.startswith("gpuslice: error: ")
    assert "--metrics-auth (GPUSLICE_METRICS_AUTH) kubernetes needs the Kubernetes API" in line
