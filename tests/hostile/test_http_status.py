"""Hostile HTTP clients of the status and metrics endpoints, over real TCP sockets: an
over-long request line or headers get one line (414 / 431), slow clients are timed
out and cannot pile up connections or file descriptors, and a scrape of a large
/metrics page is rendered off the loop, shared by concurrent scrapers, while an
Allocate answers well within a second."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from agent_harness import GPU, serving
from process_harness import AgentProcess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpuslice.adapters.deviceplugin import DevicePluginServer
from gpuslice.adapters.fake import load_spec
from gpuslice.adapters.metrics import PrometheusMetrics
from gpuslice.adapters.metrics.scrape import ScrapeCollector
from gpuslice.adapters.status_http import (
    MAX_CONNECTIONS,
    MAX_LINE,
    METRICS_NAME,
    SharedRender,
    StatusServer,
)
from gpuslice.core.resources import build_resources
from gpuslice.core.response import AllocateOptions
from gpuslice.core.sharing import ResourceSettings
from gpuslice.frontends.deviceplugin.resource_handler import ResourceHandler
from gpuslice.testing.kubelet import KubeletStandin

from .invariant import RSS_GROWTH_LIMIT, answers_allocate, rss_bytes

PODS = 4000
SCRAPERS = 8


def _ready() -> tuple[bool, dict[str, object]]:
    return True, {}


async def _exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def _status(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture
async def server() -> AsyncIterator[StatusServer]:
    async with StatusServer("127.0.0.1:0", _ready) as srv:
        yield srv


async def test_a_100_kib_request_line_is_414_in_one_line(server: StatusServer) -> None:
    raw = await _exchange(server.port, b"GET /" + b"a" * 100 * 1024 + b" HTTP/1.1\r\n\r\n")
    code, body = _status(raw)
    assert code == 414
    assert body == f"request line over {MAX_LINE} bytes\n".encode()
    code, _ = _status(await _exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n"))
    assert code == 200  # still serving


@pytest.mark.parametrize(
    "headers",
    [
        b"X-Big: " + b"b" * (MAX_LINE + 10) + b"\r\n",  # one line too long
        b"".join(b"X-%d: %s\r\n" % (i, b"c" * 100) for i in range(200)),  # too many
    ],
    ids=["long-line", "many-lines"],
)
async def test_oversized_headers_are_431_in_one_line(server: StatusServer, headers: bytes) -> None:
    raw = await _exchange(server.port, b"GET /readyz HTTP/1.1\r\n" + headers + b"\r\n")
    code, body = _status(raw)
    assert code == 431
    assert body.count(b"\n") == 1
    assert body.startswith(b"request headers over")


async def test_a_slow_client_is_closed_after_the_timeout() -> None:
    async with StatusServer("127.0.0.1:0", _ready, timeout_s=0.2) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finishes
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
        writer.close()
        assert srv.open_connections == 0


async def test_slow_clients_cannot_keep_the_probes_out(server: StatusServer) -> None:
    """More idle connections than the limit: the oldest are closed to make room, and
    a probe arriving after them is answered at once."""
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(300)]
    try:
        code, _ = _status(await _exchange(server.port, b"GET /healthz HTTP/1.1\r\n\r\n"))
        assert code == 200
        assert server.open_connections <= MAX_CONNECTIONS
    finally:
        for _, writer in idle:
            writer.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_agent_under_300_slow_connections_keeps_its_fds_and_serves(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess]
) -> None:
    """`gpuslice run` with its status port: 300 idle connections and a 100 KiB request
    line; its fds grow by at most the connection limit, the probes and Allocate answer."""
    port = _free_port()
    argv = ["--fake-hardware", "t4", "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock")]
    agent = await AgentProcess.start([*argv, "--status-address", f"127.0.0.1:{port}"])
    processes.append(agent)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 1}), 15)
    pid = agent.proc.pid
    fds, rss = _fds(pid), rss_bytes(pid)
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(300)]
    try:
        raw = await _exchange(port, b"GET /" + b"a" * 100 * 1024 + b" HTTP/1.1\r\n\r\n")
        assert _status(raw)[0] == 414
        code, _ = _status(await _exchange(port, b"GET /healthz HTTP/1.1\r\n\r\n"))
        assert code == 200
        grown = _fds(pid) - fds
        print(f"agent fds {fds}, with 300 idle connections +{grown}")
        assert grown <= MAX_CONNECTIONS + 2
        await answers_allocate(kubelet)
        assert rss_bytes(pid) - rss < RSS_GROWTH_LIMIT
    finally:
        for _, writer in idle:
            writer.close()
    assert agent.proc.returncode is None
    assert "Traceback" not in agent.log


class _Pods(ScrapeCollector[int]):
    """A page the size of a node with many pods: five series per pod."""

    def render(self, value: int) -> Iterator[Metric]:
        for name in ("used", "peak", "limit", "share", "procs"):
            family = GaugeMetricFamily(f"test_pod_{name}", "A pod's series.", labels=["pod"])
            for i in range(value):
                family.add_metric([f"namespace-{i % 50}/pod-{i:05d}"], float(i))
            yield family


async def test_allocate_answers_within_a_second_under_8_scrapers_of_a_large_page() -> None:
    metrics = PrometheusMetrics(process=False)
    metrics.add(_Pods(lambda: PODS))
    page = SharedRender(metrics.page, metrics.prepare)
    (resource,) = build_resources(load_spec("t4x4"), ResourceSettings())
    with tempfile.TemporaryDirectory(prefix="gsh-", dir="/tmp") as plugin_dir:
        async with (
            KubeletStandin(plugin_dir) as kubelet,
            StatusServer("127.0.0.1:0", None, page, name=METRICS_NAME) as srv,
        ):
            plugin = DevicePluginServer(ResourceHandler(resource, AllocateOptions()), plugin_dir)
            await plugin.start()
            await plugin.register(kubelet.socket_path)
            await kubelet.wait_for(lambda k: k.node_status().allocatable.get(resource.name) == 4)
            stop = asyncio.Event()
            sizes: list[int] = []

            async def scrape() -> None:
                while not stop.is_set():
                    raw = await _exchange(srv.port, b"GET /metrics HTTP/1.1\r\n\r\n")
                    sizes.append(len(raw))

            scrapers = [asyncio.create_task(scrape()) for _ in range(SCRAPERS)]
            waits: list[float] = []
            try:
                while len(sizes) < 3 * SCRAPERS:
                    started = time.monotonic()
                    await kubelet.allocate(resource.name, [[resource.devices[0].id]])
                    waits.append(time.monotonic() - started)
                    await asyncio.sleep(0.01)
            finally:
                stop.set()
                await asyncio.gather(*scrapers)
                await plugin.stop(0)
    print(
        f"{len(waits)} Allocates, slowest {max(waits) * 1000:.0f} ms; {len(sizes)} scrapes "
        f"of {min(sizes) // 1024} KiB shared {page.renders} renders"
    )
    assert min(sizes) > PODS * 5 * 40  # the whole page, every time
    assert max(waits) < 1.0
    assert page.renders < len(sizes)  # concurrent scrapers shared renders
