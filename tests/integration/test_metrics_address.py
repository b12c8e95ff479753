"""--metrics-address: /metrics alone on its own listener (which can be bound to
localhost), the probes alone on --status-address; unset, /metrics stays on the
status address. Two agents (an upgrade under hostNetwork) share both ports."""

from __future__ import annotations

import asyncio
import os
import socket

from process_harness import AgentProcess, clean_env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _get(port: int, path: str) -> int:
    for _ in range(100):  # until the agent listens
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except ConnectionRefusedError:
            await asyncio.sleep(0.05)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return int(raw.split()[1])


async def _agent(plugin_dir: str, *args: str) -> AgentProcess:
    kubelet_socket = os.path.join(plugin_dir, "kubelet.sock")
    argv = ["--fake-hardware", "t4", "--kubelet-socket", kubelet_socket, *args]
    return await AgentProcess.start(argv, env=clean_env())


async def test_metrics_on_their_own_address_and_probes_alone_on_the_status_address(
    plugin_dir: str, processes: list[AgentProcess]
) -> None:
    status, metrics = _free_port(), _free_port()
    flags = ("--status-address", f"127.0.0.1:{status}", "--metrics-address", f"127.0.0.1:{metrics}")
    processes.append(await _agent(plugin_dir, *flags))
    processes.append(await _agent(plugin_dir, *flags))  # a successor: same ports
    assert await _get(metrics, "/metrics") == 200
    assert await _get(metrics, "/healthz") == 404
    assert await _get(status, "/metrics") == 404
    assert await _get(status, "/healthz") == 200
    assert all(p.proc.returncode is None for p in processes)


async def test_without_a_metrics_address_metrics_stay_on_the_status_address(
    plugin_dir: str, processes: list[AgentProcess]
) -> None:
    status = _free_port()
    processes.append(await _agent(plugin_dir, "--status-address", f"127.0.0.1:{status}"))
    assert await _get(status, "/metrics") == 200
    assert await _get(status, "/readyz") in (200, 503)
