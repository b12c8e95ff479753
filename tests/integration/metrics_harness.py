"""Scraping the agent: `gpuslice run` in node mode against the API server stand-in and
the kubelet stand-in, /metrics read over HTTP with prometheus-client's parser, and a
real Prometheus server scraping it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from node_harness import CONFIGS, NAMESPACE, NODE
from process_harness import AgentProcess, clean_env
from prometheus_client.parser import text_string_to_metric_families

from gpuslice.adapters.kube.rbac import RULES
from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.testing.apiserver import FakeApiServer, Grant, write_kubeconfig
from gpuslice.testing.configmap import write_configmap_volume

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
ADDRESS = re.compile(r"address='?(127\.0\.0\.1):(\d+)")
PROXIES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def parse(page: str) -> Samples:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels` (None: there is none)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else None


async def scrape(port: int) -> Samples:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nAccept: text/plain\r\n\r\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return parse(body.decode())


@dataclass
class ScrapedNode:
    """A `gpuslice run` process in node mode, its API server and its files."""

    proc: AgentProcess
    api: FakeApiServer
    port: int  # of --status-address
    configs: Path  # the mounted ConfigMap directory
    events: Path  # the simulated backend's events file

    def set_label(self, value: str | None) -> None:
        self.api.put_node(NODE, {DEFAULT_LABEL: value} if value else {})

    def inject(self, *events: dict[str, Any]) -> None:
        with self.events.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(e) + "\n" for e in events)


@asynccontextmanager
async def scraped_node(
    plugin_dir: str, work: Path, port: int = 0, extra: Sequence[str] = ()
) -> AsyncIterator[ScrapedNode]:
    """The agent on t4x4 serving the default config ts-4 of CONFIGS, /metrics on `port`
    (0: one it picks), with `extra` flags; the API server grants exactly the RBAC rules."""
    api = FakeApiServer(grants(NAMESPACE))
    await api.start()
    api.put_node(NODE)
    configs = work / "configs"
    configs.mkdir()
    write_configmap_volume(str(configs), CONFIGS)
    events = Path(plugin_dir) / "events.jsonl"
    env = {k: v for k, v in clean_env().items() if k not in PROXIES}
    proc = await AgentProcess.start(
        [
            "--fake-hardware", "t4x4",
            "--fake-events", str(events),
            "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock"),
            "--kubeconfig", write_kubeconfig(work, api.url),
            "--node-name", NODE,
            "--namespace", NAMESPACE,
            "--config-file-srcdir", str(configs),
            "--default-config", "ts-4",
            "--labels", "false",
            "--status-address", f"127.0.0.1:{port}",
            *extra,
        ],
        env=env,
    )  # fmt: skip
    try:
        match = ADDRESS.search(await proc.wait_for_line("status_serving"))
        assert match, proc.log
        yield ScrapedNode(proc, api, int(match.group(2)), configs, events)
    finally:
        await proc.kill()
        await api.close()


def grants(namespace: str) -> list[Grant]:
    """What binding RULES as documented grants an agent running in `namespace`."""
    return [
        Grant(group, frozenset(rule.resources), frozenset(rule.verbs), rule.namespace(namespace))
        for rule in RULES
        for group in rule.api_groups
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A real Prometheus server scraping one target (and `others`) every SCRAPE_S, storing
    in `work`; with `token_file`, sending its content as a bearer token."""

    SCRAPE_S = 0.5  # its first scrape still waits for discovery's first update (5 s)

    def __init__(
        self, binary: str, target: str, work: Path, *others: str, token_file: Path | None = None
    ) -> None:
        self.binary = binary
        self.port = free_port()
        self.work = work
        self.proc: asyncio.subprocess.Process | None = None
        config = work / "prometheus.yml"
        interval = f"{int(self.SCRAPE_S * 1000)}ms"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {interval}\n"
            f"  scrape_timeout: {interval}\n"
            "scrape_configs:\n"
            "  - job_name: gpuslice\n"
            "    honor_labels: true\n"
            + (f"    authorization:\n      credentials_file: {token_file}\n" if token_file else "")
            + "    static_configs:\n"
            f"      - targets: {[target, *others]!r}\n",
            encoding="utf-8",
        )
        self.config = config
        # Prometheus' own requests never go through a proxy of this environment.
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    async def start(self, timeout_s: float = 20.0) -> None:
        log = (self.work / "prometheus.log").open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.work / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()
        await self._until(self._ready, timeout_s, "ready")

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    def log(self) -> str:
        return (self.work / "prometheus.log").read_text(errors="replace")

    def _get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with self._http.open(url, timeout=5) as reply:
            return json.loads(reply.read()) if path.startswith("/api/") else reply.status

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log()}")
        try:
            return bool(self._get("/-/ready") == 200)
        except OSError:
            return False

    def query(self, promql: str) -> dict[frozenset[tuple[str, str]], float]:
        """An instant query: labels (without __name__) -> value."""
        answer = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert answer["status"] == "success", answer
        return {
            frozenset((k, v) for k, v in r["metric"].items() if k != "__name__"): float(
                r["value"][1]
            )
            for r in answer["data"]["result"]
        }

    async def until(
        self,
        promql: str,
        done: Callable[[dict[frozenset[tuple[str, str]], float]], bool],
        timeout_s: float = 15.0,
    ) -> dict[frozenset[tuple[str, str]], float]:
        """Poll the query (a few times per scrape) until `done` holds for its result."""
        found: dict[frozenset[tuple[str, str]], float] = {}

        def check() -> bool:
            nonlocal found
            found = self.query(promql)
            return done(found)

        try:
            await self._until(check, timeout_s, promql)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; its last result: {found}") from None
        return found

    async def _until(self, check: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(check):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s}s for {what}; log: {self.log()[-2000:]}")
            await asyncio.sleep(self.SCRAPE_S / 5)


def prometheus_binary() -> str:
    """The prometheus binary on PATH; a skip where it is missing, a failure where CI sets
    GPUSLICE_REQUIRE_PROMETHEUS_TEST=1 (.ci/run installs it)."""
    found = shutil.which("prometheus")
    if found is None:
        why = "no prometheus on PATH (apt-get install prometheus)"
        if os.environ.get("GPUSLICE_REQUIRE_PROMETHEUS_TEST") == "1":
            pytest.fail(f"{why}; GPUSLICE_REQUIRE_PROMETHEUS_TEST=1 needs it")
        pytest.skip(why)
    return found
