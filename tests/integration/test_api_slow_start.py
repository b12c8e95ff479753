"""A fleet of real `gpuslice run` processes started at once against one API server stand-in
that first refuses connections, then answers later than the client's 10 s read timeout,
then answers on time again (a control plane in a brown-out during a fleet-wide rollout).

No agent exits. Those whose config is chosen per node through the API (the ConfigMap and
their Node's label) cannot decide what to serve: they serve nothing and say on readiness
what they wait for and the last error (connection refused, then ReadTimeout), one log line
per kind of failure. Those with a config file serve their kubelet stand-in at once; their
labels wait. Once the API answers on time, every agent converges: the per-node ones serve
the entry their label names, and every NodeFeature is written. During an upgrade, a
successor waiting so leaves its predecessor serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from agent_harness import GPU, remove_dir, serving, short_dir
from process_harness import AgentProcess, clean_env, http_json

from gpuslice.core.selection import DEFAULT_LABEL
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.kubelet import KubeletStandin

PER_NODE, FILE = 16, 4  # agents of each kind: bounded for a 2-core CI machine
NS, CM = "gpuslice", "gpuslice-configs"
LATE_S = 60.0  # far past the client's 10 s read timeout
WITHIN_S = 120.0  # a hang detector for a loaded machine, not a budget
ADDRESS = re.compile(r"address='?127\.0\.0\.1:(\d+)")
pytestmark = pytest.mark.timeout(600)


def time_slicing(replicas: int) -> str:
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: {GPU}\n      replicas: {replicas}\n"
    )


@dataclass
class Member:
    node: str
    kubelet: KubeletStandin
    proc: AgentProcess
    port: int = 0


@contextlib.asynccontextmanager
async def fleet(
    kubeconfig: str, config_file: Path
) -> AsyncIterator[tuple[list[Member], list[Member]]]:
    """PER_NODE agents following the ConfigMap through the API, FILE agents with a config
    file, each with its own kubelet stand-in; all started at once, all killed at the end."""
    per_node: list[Member] = []
    files: list[Member] = []
    dirs: list[str] = []
    env = clean_env(NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    try:
        for i in range(PER_NODE + FILE):
            node = f"gpu-node-{i:02d}"
            plugin_dir = short_dir()
            dirs.append(plugin_dir)
            kubelet = KubeletStandin(plugin_dir)
            await kubelet.start()
            source = ["--config-map", CM] if i < PER_NODE else ["--config-file", str(config_file)]
            proc = await AgentProcess.start(
                ["--fake-hardware", "t4", *source, "--namespace", NS, "--node-name", node,
                 "--kubeconfig", kubeconfig, "--sleep-interval", "2s",
                 "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock"),
                 "--status-address", "127.0.0.1:0"],
                env=env,
            )  # fmt: skip
            (per_node if i < PER_NODE else files).append(Member(node, kubelet, proc))
        yield per_node, files
    finally:
        for member in [*per_node, *files]:
            await member.proc.kill()
            await member.kubelet.stop()
        for plugin_dir in dirs:
            remove_dir(plugin_dir)


def alive(members: list[Member]) -> None:
    exited = [m.node for m in members if m.proc.proc.returncode is not None]
    assert not exited, f"agents exited: {exited}\n{members[0].proc.log}"


async def each(members: list[Member], check: Callable[[Member], Awaitable[None]]) -> None:
    async with asyncio.timeout(WITHIN_S):
        await asyncio.gather(*(check(m) for m in members))


async def test_a_fleet_started_against_a_slow_api_waits_serves_what_it_can_and_converges(
    tmp_path: Path,
) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(time_slicing(2))
    async with FakeApiServer() as server:
        server.put_config_map(NS, CM, {"ts-2": time_slicing(2), "ts-4": time_slicing(4)})
        for i in range(PER_NODE + FILE):
            server.put_node(f"gpu-node-{i:02d}", {DEFAULT_LABEL: "ts-4"})
        kubeconfig = write_kubeconfig(tmp_path, server.url)
        port = int(server.url.rsplit(":", 1)[1])
        await server.close()  # connections refused
        async with fleet(kubeconfig, config_file) as (per_node, files):
            everyone = [*per_node, *files]

            async def status_port(m: Member) -> None:
                line = await m.proc.wait_for_line("status_serving", WITHIN_S)
                match = ADDRESS.search(line)
                assert match, line
                m.port = int(match.group(1))

            await each(everyone, status_port)

            async def refused(m: Member) -> None:
                await m.proc.wait_for_line("api_first_read_waiting", WITHIN_S)
                code, body = await http_json(m.port, "/readyz")
                assert code == 503, body
                detail = body["config"]["detail"]
                assert detail.startswith(
                    f"waiting for the Kubernetes API to read ConfigMap {NS}/{CM} (attempt "
                ), detail
                assert "unreachable" in detail, detail

            async def served_alone(m: Member) -> None:  # the config file needs no API
                await m.kubelet.wait_for(lambda k: serving(k, {GPU: 2}), WITHIN_S)
                await m.proc.wait_for_line("labels_failed", WITHIN_S)
                code, body = await http_json(m.port, "/readyz")
                assert code == 200, body  # labels are retried and reported, never a reason
                assert body["labels"]["ok"] is False, body
                assert "unreachable" in body["labels"]["detail"], body

            await each(per_node, refused)
            await each(files, served_alone)
            alive(everyone)

            server.answer_late(LATE_S)
            await server.start(port)  # listening again, answering past the read timeout

            async def timed_out(m: Member) -> None:
                await m.proc.wait_for_lines("api_first_read_waiting", 2, WITHIN_S)
                waits = [ln for ln in m.proc.lines if "api_first_read_waiting" in ln]
                assert "ReadTimeout" in waits[1], waits
                code, body = await http_json(m.port, "/readyz")
                assert code == 503, body
                assert "ReadTimeout" in body["config"]["detail"], body

            await each(per_node, timed_out)
            alive(everyone)
            for m in per_node:
                assert m.kubelet.registrations == [], m.node  # nothing to withdraw later

            server.on_time()

            async def converged(m: Member) -> None:
                await m.kubelet.wait_for(lambda k: serving(k, {GPU: 4}), WITHIN_S)
                await m.proc.wait_for_line("api_first_read_done", WITHIN_S)

            async def labelled(m: Member) -> None:
                await m.proc.wait_for_line("node_feature_written", WITHIN_S)

            await each(per_node, converged)
            await each(everyone, labelled)
            assert len(server.features) == PER_NODE + FILE
            for m in everyone:
                code, body = await http_json(m.port, "/readyz")
                assert code == 200, body
            alive(everyone)
            for m in everyone:
                m.proc.signal(signal.SIGTERM)
            for m in everyone:
                rc, _ = await m.proc.wait()
                assert rc == 0, m.proc.log
                assert "Traceback" not in m.proc.log


async def test_a_successor_waiting_for_the_api_leaves_its_predecessor_serving(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    """An upgrade during an API outage: the new agent cannot choose its per-node config, so
    it neither takes the device-plugin directory nor registers anything; the old one keeps
    serving the kubelet. Once the API is back the new one reads its config, waits for the
    old one's lock as usual, and serves the same config when the old one exits."""
    async with FakeApiServer() as server:
        server.put_config_map(NS, CM, {"ts-4": time_slicing(4)})
        server.put_node("gpu-node-00", {DEFAULT_LABEL: "ts-4"})
        kubeconfig = write_kubeconfig(tmp_path, server.url)
        port = int(server.url.rsplit(":", 1)[1])

        async def start(pod: str) -> AgentProcess:
            proc = await AgentProcess.start(
                ["--fake-hardware", "t4", "--config-map", CM, "--namespace", NS,
                 "--node-name", "gpu-node-00", "--kubeconfig", kubeconfig, "--labels", "false",
                 "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock")],
                env=clean_env(NO_PROXY="127.0.0.1", no_proxy="127.0.0.1", POD_NAME=pod),
            )  # fmt: skip
            processes.append(proc)
            return proc

        old = await start("gpuslice-old")
        await kubelet.wait_for(lambda k: serving(k, {GPU: 4}), WITHIN_S)
        await server.close()  # the API goes away
        new = await start("gpuslice-new")
        waiting = await new.wait_for_line("api_first_read_waiting", WITHIN_S)
        assert "unreachable" in waiting, waiting
        assert len(kubelet.registrations) == 1  # the old one's only
        assert serving(kubelet, {GPU: 4})
        assert not any("plugin_dir_locked_waiting" in line for line in new.lines)

        await server.start(port)  # back: the new one reads its config, then waits its turn
        await new.wait_for_line("plugin_dir_locked_waiting", WITHIN_S)
        assert serving(kubelet, {GPU: 4})
        old.signal(signal.SIGTERM)
        rc, _ = await old.wait()
        assert rc == 0, old.log
        await kubelet.wait_for(lambda k: serving(k, {GPU: 4}) and len(k.registrations) > 1, 30)
        assert new.proc.returncode is None, new.log
        new.signal(signal.SIGTERM)
        rc, _ = await new.wait()
        assert rc == 0, new.log
