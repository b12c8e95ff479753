"""`gpuslice run --dra`: the whole agent, wired as the command wires it, serving the
device-plugin API and DRA from one node state on simulated hardware, against the kubelet
stand-in (both of its sides) and the API server stand-in. Each resource name is served by
one front-end; an MPS claim goes through the node's own control daemon."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_harness import GPU, AgentLauncher, RunningAgent
from mps_harness import daemon_pid, mps_config, pipe_dir, query, runs

from gpuslice.config.options import NO_API_FOR_DRA
from gpuslice.core.errors import ConfigError
from gpuslice.testing.apiserver import FakeApiServer, write_kubeconfig
from gpuslice.testing.kubelet import KubeletStandin
from gpuslice.testing.kubelet.dra import DraKubeletStandin
from gpuslice.wiring.agent import agent

DRIVER, NODE = "gpu.nvidia.com", "node-a"


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)


@pytest.fixture
async def api(no_proxy: None) -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


def dra_flags(plugin_dir: str, api: FakeApiServer, **more: str) -> dict[str, str]:
    return {
        "dra": "true",
        "node-name": NODE,
        "kubeconfig": str(write_kubeconfig(Path(plugin_dir), api.url)),
        "dra-plugins-dir": os.path.join(plugin_dir, "plugins"),
        "dra-registry-dir": os.path.join(plugin_dir, "registry"),
        "labels": "false",
        **more,
    }


async def start(
    launcher: AgentLauncher, api: FakeApiServer, hardware: str, **kw: Any
) -> tuple[RunningAgent, DraKubeletStandin]:
    flags = dra_flags(launcher.plugin_dir, api, **kw.pop("flags", {}))
    running = await launcher.start(hardware, flags=flags, wait_ready=False, **kw)
    dra = DraKubeletStandin(flags["dra-registry-dir"], launcher.cdi_spec_dir)
    await dra.discover(DRIVER)
    await running.until_ready()
    await api.wait_for(lambda s: bool(s.dra.node_slices(NODE)))  # published once registered
    return running, dra


def claim(api: FakeApiServer, name: str, *devices: str, config: Any = ()) -> tuple[str, str, str]:
    results = [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    obj = api.dra.put_claim("ml", name, results, list(config))
    return ("ml", obj["metadata"]["uid"], name)


async def test_one_agent_serves_mig_by_dra_and_whole_gpus_by_the_device_plugin(
    kubelet: KubeletStandin, launcher: AgentLauncher, api: FakeApiServer
) -> None:
    running, dra = await start(
        launcher,
        api,
        "a100-40gb-mig-mixed",
        flags={"mig-strategy": "mixed", "dra-device-plugin-resources": GPU},
    )
    try:
        await running.registered(kubelet)
        assert set(running.served) == {GPU}  # the device plugin serves only what it keeps
        devices = api.dra.node_devices(NODE)
        assert len(devices) == 4
        assert all("-mig-" in name for name in devices)
        mig = sorted(devices)[0]
        ref = claim(api, "mig", mig)
        (device,) = (await dra.prepare(DRIVER, [ref]))[ref[1]].devices
        edits = dra.resolve_cdi(device.cdi_ids)
        assert "/dev/nvidia0" in edits["deviceNodes"]
        assert any(p.startswith("/dev/nvidia-caps/") for p in edits["deviceNodes"])
        assert await dra.unprepare(DRIVER, [ref]) == {ref[1]: ""}
    finally:
        await dra.close()


async def test_an_mps_claim_uses_the_nodes_own_control_daemon(
    kubelet: KubeletStandin, launcher: AgentLauncher, api: FakeApiServer, mps_root: Path
) -> None:
    config = mps_root.parent / "mps.yaml"
    config.write_text(mps_config(mps_root))
    running, dra = await start(launcher, api, "t4x4", config=config)
    try:
        assert running.served == {}  # every resource is DRA's: no device-plugin socket
        # published once their daemon serves (held unhealthy by "mps" until then)
        await api.wait_for(lambda s: len(s.dra.node_devices(NODE)) == 4)
        devices = api.dra.node_devices(NODE)
        assert {d["attributes"]["sharing"]["string"] for d in devices.values()} == {"mps"}
        assert daemon_pid(pipe_dir(mps_root)) is not None  # started for DRA's MPS resource
        params = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}},
        }
        config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]
        first = sorted(devices)[0]
        a, b = claim(api, "a", first, config=config), claim(api, "b", first, config=config)
        results = await dra.prepare(DRIVER, [a, b])  # two claims share the MPS-shared GPU
        assert [r.error for r in results.values()] == ["", ""]
        edits = dra.resolve_cdi(results[a[1]].devices[0].cdi_ids)
        assert "CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe" in edits["env"]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20" in edits["env"]
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        assert mounts["/mps/nvidia.com/gpu/pipe"] == str(pipe_dir(mps_root))
        assert await dra.unprepare(DRIVER, [a, b]) == {a[1]: "", b[1]: ""}
    finally:
        await dra.close()


async def test_mps_on_a_mig_device_is_a_daemon_of_the_claims_own(
    kubelet: KubeletStandin, launcher: AgentLauncher, api: FakeApiServer, mps_root: Path
) -> None:
    """As `gpuslice run --dra --mps-root` wires it: no sharing.mps in the node's config."""
    flags = {"mps-root": str(mps_root)}
    _, dra = await start(launcher, api, "a100-40gb-mig-mixed", flags=flags)
    try:
        await api.wait_for(lambda s: any("-mig-" in n for n in s.dra.node_devices(NODE)))
        mig = next(n for n in sorted(api.dra.node_devices(NODE)) if "-mig-" in n)
        params = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}},
        }
        config = [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}}]
        a = claim(api, "a", mig, config=config)
        assert (await dra.prepare(DRIVER, [a]))[a[1]].error == ""
        own = mps_root / "dra-claims" / a[1] / "pipe"
        pid = daemon_pid(own)
        assert pid is not None
        assert query(own, "get_default_active_thread_percentage") == "20.0"
        assert await dra.unprepare(DRIVER, [a]) == {a[1]: ""}
        assert not runs(pid)
    finally:
        await dra.close()


def test_dra_without_a_kubernetes_api_or_a_cdi_directory_is_refused_in_one_line(
    launcher: AgentLauncher, api: FakeApiServer
) -> None:
    flags = dra_flags(launcher.plugin_dir, api)
    del flags["kubeconfig"]
    with pytest.raises(ConfigError) as err:
        agent(launcher.options("t4", flags=flags))
    assert str(err.value) == NO_API_FOR_DRA
    flags = {**dra_flags(launcher.plugin_dir, api), "cdi-spec-dir": ""}
    with pytest.raises(ConfigError, match=r"^--dra \(GPUSLICE_DRA\): .* set --cdi-spec-dir"):
        agent(launcher.options("t4", flags=flags))
