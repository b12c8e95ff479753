"""Signals at awkward moments, on `gpuslice run` as a real process: a SIGHUP while the
process is still importing must not end it (its handler is in place before any heavy
module loads, and the reload it asks for is kept); a SIGTERM while the first read of the
Node hangs on a silent API server ends the agent at once, not after the HTTP timeout."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from agent_harness import GPU, serving
from node_harness import NODE
from process_harness import AgentProcess, clean_env

from gpuslice.testing.apiserver import NODES, FakeApiServer, write_kubeconfig
from gpuslice.testing.kubelet import KubeletStandin

CONFIG = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n"  # noqa: E501
HEAVY = "cygrpc"  # gRPC's extension: loaded only well into start-up


def _catches_hup(pid: int) -> bool:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        mask = next(ln for ln in fh if ln.startswith("SigCgt:")).split()[1]
    return bool(int(mask, 16) & (1 << (signal.SIGHUP - 1)))


def _loaded(pid: int, name: str) -> bool:
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
        return name in fh.read()


async def test_sighup_during_startup_neither_kills_nor_is_lost(
    kubelet: KubeletStandin, plugin_dir: str, processes: list[AgentProcess], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    proc = await AgentProcess.start(
        ["--fake-hardware", "t4", "--config-file", str(config),
         "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock")],
    )  # fmt: skip
    processes.append(proc)
    pid = proc.proc.pid
    while not _catches_hup(pid):  # the interpreter's own start: nothing of ours runs yet
        assert proc.proc.returncode is None, proc.log
        await asyncio.sleep(0.0005)
    assert not _loaded(pid, HEAVY), "SIGHUP was taken only after gRPC had loaded"
    config.write_text(CONFIG.replace("replicas: 2", "replicas: 3"))
    while not _loaded(pid, HEAVY):  # SIGHUPs all through the heavy imports
        proc.signal(signal.SIGHUP)
        await asyncio.sleep(0.002)
    await kubelet.wait_for(lambda k: serving(k, {GPU: 3}), 20)
    assert proc.proc.returncode is None
    proc.signal(signal.SIGTERM)
    rc, _ = await proc.wait()
    assert rc == 0, proc.log


FIRST_READS = {
    # per-node configs from a mounted directory: the Node's labels are read first
    "node": (["--config-file-srcdir"], f"{NODES}/{NODE}"),
    # per-node configs from the API: the ConfigMap is read first, then the Node
    "configmap": (["--config-map", "gpuslice-configs", "--namespace", "gpuslice"], "/configmaps/"),
}


@pytest.mark.parametrize("first", FIRST_READS)
async def test_sigterm_while_the_first_read_hangs_exits_at_once(
    plugin_dir: str, processes: list[AgentProcess], tmp_path: Path, first: str
) -> None:
    flags, stalled = FIRST_READS[first]
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "ts-2").write_text(CONFIG)
    source = [*flags, str(configs)] if len(flags) == 1 else flags
    async with FakeApiServer() as server:
        server.put_node(NODE)
        server.put_config_map("gpuslice", "gpuslice-configs", {"ts-2": CONFIG})
        server.stall_next("GET", stalled)
        proc = await AgentProcess.start(
            ["--fake-hardware", "t4", *source,
             "--kubelet-socket", os.path.join(plugin_dir, "kubelet.sock"),
             "--node-name", NODE, "--kubeconfig", write_kubeconfig(tmp_path, server.url)],
            env=clean_env(NO_PROXY="127.0.0.1", no_proxy="127.0.0.1"),
        )  # fmt: skip
        processes.append(proc)
        await server.wait_for(lambda s: any(stalled in r.path for r in s.requests))
        proc.signal(signal.SIGTERM)
        rc, took = await proc.wait()
    print(f"SIGTERM during a hanging first {first} read -> exited in {took:.2f} s")
    assert rc == 0, proc.log
    assert took < 3.0, f"took {took:.1f}s to stop"
